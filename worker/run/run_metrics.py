"""A mission run's metrics and log lines, read off its events.

``RunMetrics`` is called with each run event by the run's sink (``worker.run.mission_loop``),
synchronously: it counts what the loop reports as it
happens (tool durations, parallel read groups, reminders sent, compactions and their
failures) and logs compactions; the calls' outcomes are counted once the iteration is stored
(``count_calls``), so that a run whose result is dropped (a lost lease) counts nothing twice,
and the calls an earlier attempt ran are counted by the worker that ran them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from functools import cache

from prometheus_client import Counter, Histogram

from planner import (
    CallFinished,
    Compacted,
    CompactionFailed,
    ReadsOverlapped,
    RequestSent,
    RunEvent,
    RunRecord,
)
from worker import metrics
from worker.store.rows import call_outcome

__all__ = ["RunMetrics", "count_calls"]

logger = logging.getLogger(__name__)


class RunMetrics:
    """Counts one run's events (see the module docstring)."""

    def __call__(self, event: RunEvent) -> None:
        """Count ``event``."""
        if isinstance(event, CallFinished):
            executed = event.executed
            if executed.ran and not event.settled:  # a known tool: the label is bounded
                label = metrics.tool_label(executed.call.name)
                _tool_duration(label).observe(executed.duration_ms / 1000)
        elif isinstance(event, RequestSent):
            for reminder in event.reminders:
                _reminder_counter(reminder.producer).inc()
        elif isinstance(event, ReadsOverlapped):
            metrics.PARALLEL_READ_BATCHES.inc()
        elif isinstance(event, Compacted):
            compaction = event.compaction
            metrics.COMPACTIONS_TRIGGERED.inc()
            metrics.COMPACTED_TURNS.observe(compaction.folded_turns)
            logger.info(
                "context compacted before round %d: %d turn(s) folded, %d -> %d tokens",
                event.round,
                compaction.folded_turns,
                compaction.tokens_before,
                compaction.tokens_after,
            )
        elif isinstance(event, CompactionFailed):
            metrics.COMPACTION_FAILURES.labels(reason=event.error.reason).inc()


def count_calls(record: RunRecord, tool_names: Collection[str]) -> None:
    """Count the calls of a stored run by tool and outcome; the calls an earlier attempt ran
    are left out, a name the model invented is counted as ``(unknown)`` and an MCP server's
    tools as ``SERVER__*`` (``metrics.tool_label``: a label must not take unbounded values)."""
    for call in record.calls:
        if (call.round, call.index) in record.settled:
            continue
        name = call.call.name
        tool = metrics.tool_label(name) if name in tool_names else "(unknown)"
        _tool_calls(tool, call_outcome(call)).inc()


# The labelled series a run counts in, looked up once per label values (``labels`` checks its
# arguments and takes a lock every time): the cache holds what the metric holds anyway.


@cache
def _tool_duration(label: str) -> Histogram:
    return metrics.TOOL_DURATION.labels(tool=label)


@cache
def _tool_calls(tool: str, outcome: str) -> Counter:
    return metrics.TOOL_CALLS.labels(tool=tool, outcome=outcome)


@cache
def _reminder_counter(producer: str) -> Counter:
    return metrics.REMINDERS_INJECTED.labels(producer=producer or "(unnamed)")
