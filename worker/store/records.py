"""The values that cross the store seam (``worker.store.base.MissionStore``): a claimed
mission and its iteration, the rows of a run's calls and compactions, its checkpoint, an
approval request, and how a run ends (``RunEnd``) with what storing it did (``EndResult``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from planner.gate import Reservation
from planner.policy import PolicyMode, UserPolicySettings
from planner.replies import StopReason
from worker.db.statuses import (
    CallOutcome,
    CatchUp,
    IterationStatus,
    MissionStatus,
    RunnerStopReason,
)
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "ApprovalRequestRow",
    "ArchiveRow",
    "CallStart",
    "ClaimOrder",
    "ClaimedMission",
    "EndResult",
    "Finished",
    "Interrupted",
    "IterationOutcome",
    "NoRun",
    "Parked",
    "ParkedRun",
    "RoundCheckpoint",
    "RunEnd",
    "StartedIteration",
    "ToolInvocationRow",
    "user_settings_from_row",
]


@dataclass(frozen=True)
class ClaimedMission:
    """A mission this worker holds the lease on, with its agent and the owner's policy
    settings (read once, at claim time, for the whole iteration).

    ``scheduled_for`` is the ``next_run_at`` the mission had when claimed (UTC-aware).
    ``policy_mode`` is the agent's override of the daemon's policy mode (``None``: none).
    ``mcp_servers`` are the agent's MCP servers (tool sources), by name, secrets included.

    ``destructive_policy`` is the agent's override of ``MANA_AI_POLICY_DESTRUCTIVE`` (``deny``
    or ``ask``; ``None``: none).

    ``claim_due`` also starts the iterations of the missions it claims: ``iteration`` is the
    row to write into (``None``: that scheduled run already finished, or the deadline
    passed), without the takeover details (``MissionStore.resume_details``), and
    ``tokens_used_24h`` the tokens of the agent's other iterations started in the last 24
    hours when the agent has a daily budget (``None``: no budget). ``past_deadline``: the
    mission's deadline passed before the claim (no run starts after it: the store decides
    it, the runner only completes the mission; the deadline rule lives in the claim).

    ``claimed_at`` is the database's clock at the claim (UTC-aware; ``None`` from a store
    without one): the one clock that decides what is due and, with it, when the mission runs
    next, whatever this worker's clock says. ``catch_up`` and ``catch_up_window`` are the
    mission's policy for missed runs (``CatchUp``); ``missed``: the claimed run is a missed
    one of a ``skip`` mission (no iteration was started: the runner moves the schedule on).
    """

    id: int
    objective: str
    cron: str | None
    timezone: str
    scheduled_for: datetime
    deadline: datetime | None
    agent_id: int
    agent_name: str
    owner_user_id: str
    model: str | None
    system_prompt: str
    max_rounds: int
    max_tokens_per_day: int | None
    allowed_tools: tuple[str, ...] | None
    policy_mode: str | None = None
    user_policy: UserPolicySettings = field(default_factory=UserPolicySettings)
    compact_max_ctx: int | None = None
    mcp_servers: tuple[McpServerConfig, ...] = ()
    iteration: StartedIteration | None = None
    tokens_used_24h: int | None = None
    past_deadline: bool = False
    destructive_policy: str | None = None
    claimed_at: datetime | None = None
    catch_up: CatchUp = CatchUp.ONCE
    catch_up_window: timedelta | None = None
    missed: bool = False


@dataclass(frozen=True)
class StartedIteration:
    """The iteration row a run writes into; ``attempt`` > 1 when it took over a dead run.

    A takeover gets the checkpoint the earlier attempts stored: the message log, the rounds
    done, their tokens and reminders, and the ``tool_invocations`` rows of the last round
    (``pending_rows``: ``id``, ``position``, ``outcome``, ``result``, ``error``,
    ``policy_decision``), so it can go on where they stopped; and how many compactions the
    earlier attempts did (``compactions``) and tried (``compaction_attempts``), and the latest
    one's ``(round it ran before, tokens in context after it)`` (``last_compaction``); and the
    approval requests of the last round (``approvals``: ``id``, ``position``, ``status``,
    ``tool``, ``arguments_hash``, ``decided_by``, ``decided_at``, ``decision_note``), a
    pending one past its time to live read as ``expired`` (and stored so).
    """

    id: int
    attempt: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reminders: list[dict[str, Any]] = field(default_factory=list)
    pending_rows: list[dict[str, Any]] = field(default_factory=list)
    compactions: int = 0
    compaction_attempts: int = 0
    last_compaction: tuple[int, int] | None = None
    approvals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def resumable(self) -> bool:
        """True when an earlier attempt left a checkpoint to go on from."""
        return self.attempt > 1 and bool(self.messages)


@dataclass(frozen=True)
class ToolInvocationRow:
    """One executed or denied tool call, as stored in ``tool_invocations``."""

    round: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    result: Any
    error: str | None
    outcome: CallOutcome
    duration_ms: float
    policy_decision: dict[str, Any] | None = None
    policy_mode: PolicyMode | None = None
    attempt: int = 1
    position: int = 0
    idempotency_key: str | None = None
    row_id: int | None = None  # set: the row exists (a journaled write): update it


@dataclass(frozen=True)
class ArchiveRow:
    """One compaction of an iteration's context, as stored in ``compacted_turns``; with an
    ``error``, an attempt that changed nothing (``folded`` empty, ``summary`` empty)."""

    compaction_index: int
    round: int
    start_index: int
    folded: list[dict[str, Any]]
    folded_turns: int
    summary: str
    tokens_before: int
    tokens_after: int
    model: str | None
    duration_ms: float
    attempt: int = 1
    error: str | None = None


@dataclass(frozen=True)
class RoundCheckpoint:
    """What a round commit stores on the iteration row: the message log so far (the stored
    format), the rounds done, their tokens and the reminders sent; and the compactions of the
    log not stored yet (``archive``), in the same transaction, so a compacted log is never
    stored without what it folded."""

    messages: list[dict[str, Any]]
    rounds: int
    prompt_tokens: int
    completion_tokens: int
    reminders: list[dict[str, Any]]
    archive: Sequence[ArchiveRow] = ()


@dataclass(frozen=True)
class ApprovalRequestRow:
    """A call the gate asked a person about, as ``approval_requests`` stores it.

    Attributes:
        consumer: ``mission`` or ``mcp``.
        user_id: the user whose space the call acts in.
        call_id, tool, arguments: the call exactly as it would run.
        arguments_hash: ``planner.approvals.arguments_hash(arguments)``.
        reason: why the gate asked (its decision's message).
        ttl: how long the request waits for a decision (then it is ``expired``).
        agent_id, mission_id, iteration_id, attempt, round, position: where a mission's call
            was issued (``None`` for an MCP client's).
        reply_text: the model's text in the reply that issued the call.
        mcp_token_id: the token an MCP client called with.
        target: what the call would act on, as its tool read it back (``ToolSpec.describe``).
    """

    consumer: str
    user_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    arguments_hash: str
    reason: str
    ttl: timedelta
    agent_id: int | None = None
    mission_id: int | None = None
    iteration_id: int | None = None
    attempt: int | None = None
    round: int | None = None
    position: int | None = None
    reply_text: str | None = None
    mcp_token_id: int | None = None
    target: str | None = None


@dataclass(frozen=True)
class ParkedRun:
    """What ``end_run`` stored of a ``Parked`` end: the approval request's ``request_id``,
    whether this attempt ``created`` it (this park, or the same park before it, whose answer
    was lost: nobody was told of the request yet; ``False``: it came from an earlier attempt
    at the same park), and when it expires (``expires_at``, UTC-aware)."""

    request_id: int
    created: bool
    expires_at: datetime


@dataclass(frozen=True)
class CallStart:
    """What ``record_call_start`` stored: the ids of the calls' rows by ``(round, position)``
    (the ``started`` row's missing when its reservation was refused), and the reservation
    when it made one."""

    ids: dict[tuple[int, int], int]
    reservation: Reservation | None = None


@dataclass(frozen=True)
class ClaimOrder:
    """A claim made by a finish: ``end_run(..., claim=order)`` leases up to ``limit`` other
    due missions to the finishing worker, as ``claim_due`` would, in the same step (for
    PostgreSQL, the same statement: one round trip per mission instead of two); they come back
    in ``EndResult.claimed`` (oldest ``scheduled_for`` first). The mission being finished is
    never among them.

    Attributes:
        limit: missions to claim at most (≥ 1).
        lease, default_model, budget_window: as ``claim_due`` takes them.
    """

    limit: int
    lease: timedelta
    default_model: str | None = None
    budget_window: timedelta = timedelta(hours=24)


@dataclass(frozen=True)
class IterationOutcome:
    """What a finished run stores.

    Attributes:
        status: ``succeeded`` or ``failed``.
        messages: the stored message log (JSON-compatible list).
        next_run_at: the mission's next run (``None`` = no further run).
        mission_status: ``active`` or ``completed`` (a paused mission stays paused).
        reminders: the reminders sent with the run's requests (``[{"round", "producer",
            "text"}]``), stored apart from the message log.
    """

    status: IterationStatus
    messages: list[dict[str, Any]]
    rounds: int
    prompt_tokens: int
    completion_tokens: int
    stop_reason: StopReason | RunnerStopReason | None
    error: str | None
    next_run_at: datetime | None
    mission_status: MissionStatus
    tool_invocations: Sequence[ToolInvocationRow] = field(default_factory=tuple)
    reminders: list[dict[str, Any]] = field(default_factory=list)
    archive: Sequence[ArchiveRow] = field(default_factory=tuple)


@dataclass(frozen=True)
class Finished:
    """A run that ended (``outcome``: what it stores, with the mission's next run), for
    ``MissionStore.end_run``; by ``attempt`` of iteration ``iteration_id``."""

    iteration_id: int
    attempt: int
    outcome: IterationOutcome


@dataclass(frozen=True)
class Parked:
    """A run parked at the call ``request`` is about, waiting for a person's decision: its
    ``checkpoint`` and the calls not stored yet (``invocations``, the parked call's row
    ``parked`` among them)."""

    iteration_id: int
    attempt: int
    request: ApprovalRequestRow
    checkpoint: RoundCheckpoint
    invocations: Sequence[ToolInvocationRow] = ()


@dataclass(frozen=True)
class Interrupted:
    """A run interrupted (the worker stopping, its database away) to be taken over: stored
    ``failed`` / ``interrupted`` with ``reason``, its ``checkpoint`` (``None``: the one
    stored stays) and the calls not stored yet (they happened)."""

    iteration_id: int
    attempt: int
    reason: str
    checkpoint: RoundCheckpoint | None = None
    invocations: Sequence[ToolInvocationRow] = ()


@dataclass(frozen=True)
class NoRun:
    """No run: the schedule moves on (``next_run_at``, ``None``: none; ``mission_status``;
    ``error``: why, kept as the mission's last error), as for a skipped or missed run or a
    mission completed past its deadline."""

    next_run_at: datetime | None
    mission_status: MissionStatus
    error: str | None = None


RunEnd = Finished | Parked | Interrupted | NoRun
"""How a run ends, in one value the runner builds and ``MissionStore.end_run`` stores."""


@dataclass(frozen=True)
class EndResult:
    """What ``MissionStore.end_run`` did: ``lease_held`` (False: another worker owns the
    mission, nothing was stored), the missions a ``ClaimOrder`` claimed (``claimed``, oldest
    first), and for a park the request stored (``parked``)."""

    lease_held: bool
    claimed: tuple[ClaimedMission, ...] = ()
    parked: ParkedRun | None = None


def user_settings_from_row(row: Mapping[str, Any] | None) -> UserPolicySettings:
    """``UserPolicySettings`` from a ``user_policy_settings`` row (or its JSON form); ``None``
    (no row) gives the defaults. Malformed per-tool entries are skipped."""
    if not row:
        return UserPolicySettings()
    limits = row.get("tool_rate_limits") or {}
    return UserPolicySettings(
        destructive_opt_ins=frozenset(row.get("destructive_opt_ins") or ()),
        rate_limit=row.get("rate_limit"),
        tool_rate_limits={
            str(k): int(v) for k, v in limits.items() if isinstance(v, int) and v >= 1
        },
    )
