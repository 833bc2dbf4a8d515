"""``settled_heap``: the daemon's collector settings hold within the block and are undone
after it (tests run the daemon in-process)."""

from __future__ import annotations

import gc

from worker.daemon.heap import OLDER_THRESHOLDS, YOUNG_THRESHOLD, settled_heap


def test_the_heap_is_frozen_within_and_the_collector_restored_after() -> None:
    before = gc.get_threshold()
    with settled_heap():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
