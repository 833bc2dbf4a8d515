"""The daemon's garbage collector: the start-up heap frozen, young collections rarer.

A worker allocates many short-lived containers per mission (messages, events, rows, driver
records). With CPython's default thresholds (700, 10, 10) the cyclic collector ran about
270 young, 25 middle and 2 full collections per 1000 missions, and every full one walked the
whole start-up heap (SQLAlchemy's, pydantic's and the tools' objects: hundreds of thousands,
none of them ever garbage): 0.27-0.49 ms of CPU per mission, a fifth to a third of the
worker's (``bench/db_floor.py``, concurrency 32). ``settled_heap`` collects once, moves what
survived into the permanent generation (``gc.freeze``, which the collector no longer walks),
and raises the young threshold to ``YOUNG_THRESHOLD`` allocations: 0.02-0.03 ms per mission.
Only cyclic garbage waits longer for its collection (up to that many container allocations:
a few MiB); everything else is freed by reference counting as before.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["OLDER_THRESHOLDS", "YOUNG_THRESHOLD", "settled_heap"]

YOUNG_THRESHOLD = 50_000
"""Container allocations (less deallocations) between two young collections (CPython: 700)."""

OLDER_THRESHOLDS = (20, 100)
"""Young collections between two middle ones, and middle between two full ones (10, 10)."""


@contextmanager
def settled_heap() -> Iterator[None]:
    """Within the block: the heap so far frozen and the thresholds above; on exit the
    collector as it was (thresholds restored, the frozen objects collectable again)."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
