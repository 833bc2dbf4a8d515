"""The values of the store's status columns, as enums: what a mission, an iteration and a
tool call can be, and why a run ended when the worker (not the planner loop) ended it.

They are ``StrEnum``: a member is the string the column holds (``MissionStatus.ACTIVE ==
"active"``), so rows read back as plain strings compare equal, ``--json`` prints the string,
and the schema's values stay as they are (operators and dashboards query them directly). The
``CHECK`` constraints of ``worker.db.tables`` are built from these enums.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "FINAL_CALL_OUTCOMES",
    "CallOutcome",
    "CatchUp",
    "IterationStatus",
    "MissionStatus",
    "RunnerStopReason",
]


class MissionStatus(StrEnum):
    """``missions.status``: ``active`` (runs when due), ``paused`` (kept, never claimed, stays
    paused when a run in flight ends), ``completed`` (no further run: a one-shot mission that
    ran, a cron that never fires again, a deadline passed)."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"


class CatchUp(StrEnum):
    """``missions.catch_up``: what becomes of runs a mission missed (due while no worker could
    start them: the workers were down, the database away, a backlog). A run is missed when it
    starts more than ``MISFIRE_GRACE`` after its time.

    * ``skip``: a missed run does not run; the schedule goes on from now.
    * ``once`` (default): the runs missed collapse into one run now, then the schedule goes
      on from now.
    * ``all``: each run missed within ``missions.catch_up_window`` (default one day) runs,
      oldest first, one after another; older ones are dropped. Catch-up runs stop as soon as
      the agent's daily token budget is used up (the rest are dropped), so an outage never
      spends more than a day's budget.
    """

    SKIP = "skip"
    ONCE = "once"
    ALL = "all"


class IterationStatus(StrEnum):
    """``mission_iterations.status``: ``running`` while a worker holds it (or died holding
    it), ``awaiting_approval`` while it is parked at a call a person must approve (no worker
    holds it; the next claim after the decision resumes it), then ``succeeded`` or ``failed``
    (the ``stop_reason`` says why)."""

    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class CallOutcome(StrEnum):
    """``tool_invocations.outcome``: ``ok`` and ``error`` (the call ran, or was refused by a
    check before its handler), ``denied`` (the policy gate refused it), ``started`` (a
    journaled write or destructive call whose handler was started and whose outcome is not
    stored yet), ``unknown`` (it was running when its worker stopped), ``parked`` (the gate
    asked a person about it: it waits for the decision on its approval request)."""

    OK = "ok"
    ERROR = "error"
    DENIED = "denied"
    STARTED = "started"
    UNKNOWN = "unknown"
    PARKED = "parked"


FINAL_CALL_OUTCOMES = frozenset({CallOutcome.OK, CallOutcome.ERROR, CallOutcome.DENIED})
"""Outcomes a resumed run keeps as they are (the call is not run again)."""


class RunnerStopReason(StrEnum):
    """``mission_iterations.stop_reason`` values the worker gives (the planner loop's are
    ``planner.StopReason``): ``interrupted`` (the worker shut down, or its database stayed
    unreachable; the next claim resumes it), ``crashed`` (our own code raised),
    ``store_failed`` (the database refused what the run stored), ``budget_exhausted`` (the
    agent's daily token budget was used up; the model was not asked),
    ``tool_source_unavailable`` (a required MCP server could not be used),
    ``deadline_passed`` (the mission's deadline passed while the run waited for an approval:
    it does not go on)."""

    INTERRUPTED = "interrupted"
    CRASHED = "crashed"
    STORE_FAILED = "store_failed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    TOOL_SOURCE_UNAVAILABLE = "tool_source_unavailable"
    DEADLINE_PASSED = "deadline_passed"
