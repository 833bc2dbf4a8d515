"""How a run's end becomes what it stores: the ``IterationOutcome`` of every way a run can end,
built in one place (a loop result, a crash, a required tool source that could not be used, no
run at all), and what is stored in turn when the database refuses one (``degraded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from planner import (
    Approval,
    ApprovalRequested,
    PlannerLoopResult,
    StopReason,
    arguments_hash,
)
from planner.policy import DecisionReason
from worker.db.statuses import CatchUp, IterationStatus, MissionStatus, RunnerStopReason
from worker.mcp.sources import ToolSourceError
from worker.run.journal import MissionJournal
from worker.schedule import ScheduleError, next_run_after
from worker.store.claim import DEFAULT_CATCH_UP_WINDOW
from worker.store.records import (
    ApprovalRequestRow,
    ClaimedMission,
    IterationOutcome,
    StartedIteration,
)
from worker.store.rows import json_safe

__all__ = [
    "MAX_PROBLEMS_SHOWN",
    "NextRun",
    "approval_request",
    "degraded",
    "failed_outcome",
    "loop_outcome",
    "next_run_of",
    "no_run",
    "notice_fields",
    "problems_text",
    "unconfirmed_approvals",
]


@dataclass(frozen=True)
class NextRun:
    """The mission's next run (``at``; ``None``: none), its status after this run, and why a
    stored schedule could not be used (``error``)."""

    at: datetime | None
    mission_status: MissionStatus
    error: str | None = None


def loop_outcome(
    result: PlannerLoopResult,
    next_run: NextRun,
    journal: MissionJournal,
    problems: Sequence[str] = (),
) -> IterationOutcome:
    """The outcome of a run the loop finished: its record (``result.record``, as the journal
    writes it: the log, the calls not stored yet, the reminders, the archive), the stop reason,
    and the errors of the loop, the schedule and the tool sources (``problems``)."""
    record = result.record
    errors = [e for e in (result.error, next_run.error, problems_text(problems)) if e]
    checkpoint = journal.checkpoint()
    return IterationOutcome(
        status=IterationStatus.FAILED if result.failed else IterationStatus.SUCCEEDED,
        messages=checkpoint.messages,
        rounds=record.rounds,
        prompt_tokens=record.usage.prompt_tokens,
        completion_tokens=record.usage.completion_tokens,
        stop_reason=result.stop_reason,
        error=json_safe("; ".join(errors)) or None,
        next_run_at=next_run.at,
        mission_status=next_run.mission_status,
        tool_invocations=journal.pending_rows(),
        reminders=checkpoint.reminders,
        archive=checkpoint.archive,
    )


def unconfirmed_approvals(standing: Sequence[Approval], result: PlannerLoopResult) -> list[str]:
    """For the iteration's error: each approved call whose outcome a takeover found unknown
    (``Checkpoint.standing_approvals``) and that did not run again in this run: it is not
    reported as done, and its approval was not spent on it."""
    ran = [
        c
        for c in result.record.calls
        if c.ran
        and not c.outcome_unknown
        and c.decision is not None
        and c.decision.reason == DecisionReason.APPROVED
    ]
    return [
        f"{approval.tool} was approved ({approval.describe()}) but its worker stopped while it "
        "ran: its outcome is unknown, it was not run again, and the approval was not used up"
        for approval in standing
        if not any(approval.matches(c.call) for c in ran)
    ]


MAX_PROBLEMS_SHOWN = 5


def problems_text(problems: Sequence[str]) -> str | None:
    """What the run's tool sources left out, for the iteration's error (``None``: nothing)."""
    if not problems:
        return None
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return f"{shown}; and {more} more (see the worker's log)" if more > 0 else shown


def failed_outcome(exc: Exception, next_run: NextRun, journal: MissionJournal) -> IterationOutcome:
    """The outcome of a run that raised ``exc``: a required MCP server that could not be used
    (no run without its tools), or a crash in our own code (what the run did is kept)."""
    if isinstance(exc, ToolSourceError):
        return no_run(
            next_run,
            status=IterationStatus.FAILED,
            stop_reason=RunnerStopReason.TOOL_SOURCE_UNAVAILABLE,
            error=json_safe(str(exc)),
        )
    log = journal.log
    checkpoint = journal.checkpoint()
    return dataclasses.replace(
        no_run(
            next_run,
            status=IterationStatus.FAILED,
            stop_reason=RunnerStopReason.CRASHED,
            error=json_safe(f"internal error: {type(exc).__name__}: {exc}"),
        ),
        messages=checkpoint.messages,
        tool_invocations=journal.pending_rows(),
        reminders=checkpoint.reminders,
        archive=checkpoint.archive,
        rounds=log.rounds,
        prompt_tokens=log.usage.prompt_tokens,
        completion_tokens=log.usage.completion_tokens,
    )


def approval_request(
    mission: ClaimedMission,
    iteration: StartedIteration,
    parked: ApprovalRequested,
    *,
    ttl: timedelta,
) -> ApprovalRequestRow:
    """The approval request of a run parked at ``parked`` (the call exactly as it would run,
    the gate's reason, the model's text before it), waiting ``ttl`` for a decision."""
    call = parked.call
    arguments = json_safe(dict(call.arguments))
    return ApprovalRequestRow(
        consumer="mission",
        user_id=mission.owner_user_id,
        call_id=json_safe(call.id),
        tool=call.name,
        arguments=arguments,
        arguments_hash=arguments_hash(arguments),  # as stored, as checked when decided
        reason=json_safe(parked.decision.message or parked.decision.reason or "approval needed"),
        ttl=ttl,
        agent_id=mission.agent_id,
        mission_id=mission.id,
        iteration_id=iteration.id,
        attempt=iteration.attempt,
        round=parked.round,
        position=parked.position,
        reply_text=json_safe(parked.reply_text) if parked.reply_text else None,
        target=json_safe(parked.target) if parked.target else None,
    )


def notice_fields(
    request: ApprovalRequestRow, request_id: int, *, expires_at: datetime | None
) -> dict[str, Any]:
    """``request`` stored as ``request_id`` in the shape of an ``approval_requests`` row (what
    ``worker.approval_webhook.approval_notice`` reads)."""
    fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
    ttl = fields.pop("ttl")
    created_at = expires_at - ttl if expires_at is not None else None  # expires = now + ttl
    return fields | {"id": request_id, "expires_at": expires_at, "created_at": created_at}


def degraded(outcome: IterationOutcome) -> Iterator[IterationOutcome]:
    """What to store, in turn, when the database refuses ``outcome``: a ``store_failed``
    failure with its message log, reminders and calls but not its archive; then without its
    calls; then without its log (rounds and tokens stay: they count toward the budget); then
    the failure alone. Made one at a time, as each is refused (a stored run needs none)."""
    failed = dataclasses.replace(
        outcome,
        status=IterationStatus.FAILED,
        stop_reason=RunnerStopReason.STORE_FAILED,
        archive=(),
    )
    yield failed
    bare = dataclasses.replace(failed, tool_invocations=())
    yield bare
    unlogged = dataclasses.replace(bare, messages=[], reminders=[])
    yield unlogged
    yield dataclasses.replace(unlogged, rounds=0, prompt_tokens=0, completion_tokens=0)


def no_run(
    next_run: NextRun,
    *,
    status: IterationStatus = IterationStatus.SUCCEEDED,
    stop_reason: StopReason | RunnerStopReason | None = None,
    error: str | None = None,
) -> IterationOutcome:
    """An outcome without a loop result: the schedule advances, nothing else is stored."""
    return IterationOutcome(
        status=status,
        messages=[],
        rounds=0,
        prompt_tokens=0,
        completion_tokens=0,
        stop_reason=stop_reason,
        error=error or next_run.error,
        next_run_at=next_run.at,
        mission_status=next_run.mission_status,
    )


def next_run_of(mission: ClaimedMission, now: datetime, *, catch_up: bool = True) -> NextRun:
    """The mission's next run: its cron's next time after ``now`` (the database's clock), or,
    for a ``catch_up=all`` mission (and ``catch_up``), after the run at hand, but not before
    the mission's window, so that each missed run within the window runs in turn (those before
    it are dropped; a next run at or before ``now`` is due at once); ``completed`` past its
    deadline or when the cron never fires again; ``paused`` with the reason when its stored
    schedule no longer parses; none for a one-shot mission."""
    if mission.cron is None:
        return NextRun(None, MissionStatus.COMPLETED)
    after = now
    if catch_up and mission.catch_up == CatchUp.ALL:
        window = mission.catch_up_window or DEFAULT_CATCH_UP_WINDOW
        after = min(now, max(mission.scheduled_for, now - window))
    try:
        at = next_run_after(mission.cron, mission.timezone, after)
    except ScheduleError as exc:
        return NextRun(None, MissionStatus.PAUSED, f"schedule is broken, mission paused: {exc}")
    if at is None or (mission.deadline is not None and at > mission.deadline):
        return NextRun(None, MissionStatus.COMPLETED)
    return NextRun(at, MissionStatus.ACTIVE)
