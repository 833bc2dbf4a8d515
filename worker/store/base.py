"""The store seam: what the run, the tick, the journal and the gate need of the database, as a
protocol, and the rows that cross it.

Two implementations sit beside it: ``worker.store.postgres.PostgresMissionStore`` (PostgreSQL,
any number of replicas) and ``worker.store.memory.InMemoryMissionStore`` (one process, for unit
tests: the same semantics on dictionaries). The model is procrastinate's ``BaseConnector`` and
``InMemoryConnector``, and APScheduler 4's ``abc.py``: the seam's docstrings state what a lease
means, the units, and what is raised.

Leases (every replica follows them):

* ``claim_due`` picks due, unleased (or lease-expired) active missions, oldest ``next_run_at``
  first, and stamps ``lease_owner`` / ``lease_expires_at`` in the same step, so two workers
  never claim the same mission; it starts (or takes over) their iterations.
* Every later change (a checkpoint, a call's start, the finish, an interruption, renewal) is
  conditional on ``lease_owner`` still being the worker: a worker that lost its lease writes
  nothing. A finish, an interruption or a call's start repeated after a failure that left it
  unknown whether it was stored stores the same thing once (retries are safe).
* Lease times are the store's clock (the database's ``now()``), never a worker's, so replicas
  with skewed clocks agree on expiry.

Errors: a method raises what its backend raises when it fails (``sqlalchemy.exc.DBAPIError``
and ``OSError`` for PostgreSQL; ``worker.store.transient.is_transient`` tells the transient ones),
and ``LeaseLostError`` where a method says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from planner import RunInterrupted
from planner.gate import Reservation
from planner.policy import PolicyMode, RateLimit, UserPolicySettings
from planner.replies import StopReason
from worker.store.agent_servers import McpServerConfig
from worker.store.statuses import (
    CallOutcome,
    CatchUp,
    IterationStatus,
    MissionStatus,
    RunnerStopReason,
)

__all__ = [
    "ApprovalRequestRow",
    "ArchiveRow",
    "CallStart",
    "ClaimOrder",
    "ClaimedMission",
    "IterationOutcome",
    "LeaseLostError",
    "MissionStore",
    "ParkedRun",
    "RoundCheckpoint",
    "StartedIteration",
    "ToolInvocationRow",
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


@dataclass(frozen=True)
class ParkedRun:
    """What ``park_iteration`` stored: the approval request's ``request_id``, whether this
    attempt ``created`` it (this park, or the same park before it, whose answer was lost:
    nobody was told of the request yet; ``False``: it came from an earlier attempt at the same
    park), and when it expires (``expires_at``, UTC-aware)."""

    request_id: int
    created: bool
    expires_at: datetime


class LeaseLostError(RunInterrupted):
    """This worker no longer owns the mission's lease: it must not write or run anything (a
    run that meets it stops, and writes nothing more)."""


@dataclass(frozen=True)
class CallStart:
    """What ``record_call_start`` stored: the ids of the calls' rows by ``(round, position)``
    (the ``started`` row's missing when its reservation was refused), and the reservation
    when it made one."""

    ids: dict[tuple[int, int], int]
    reservation: Reservation | None = None


@dataclass
class ClaimOrder:
    """A claim made by a finish: ``finish_iteration(..., claim=order)`` leases up to
    ``limit`` other due missions to the finishing worker, as ``claim_due`` would, in the same
    step (for PostgreSQL, the same statement: one round trip per mission instead of two), and
    appends them to ``claimed`` (oldest ``scheduled_for`` first). The mission being finished
    is never among them.

    Attributes:
        limit: missions to claim at most (≥ 1).
        lease, default_model, budget_window: as ``claim_due`` takes them.
        claimed: filled by the store once the step stored; left empty when it raised.
    """

    limit: int
    lease: timedelta
    default_model: str | None = None
    budget_window: timedelta = timedelta(hours=24)
    claimed: list[ClaimedMission] = field(default_factory=list)


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


class MissionStore(Protocol):
    """What a worker needs of the database to run missions (see the module docstring).

    Times are UTC-aware ``datetime``; durations ``timedelta``. Ids are the store's own.
    """

    async def claim_due(
        self,
        *,
        worker_id: str,
        limit: int,
        lease: timedelta,
        default_model: str | None = None,
        budget_window: timedelta = timedelta(hours=24),
    ) -> list[ClaimedMission]:
        """Lease up to ``limit`` due missions for ``lease`` to ``worker_id`` and start their
        iterations, as one atomic step (``ClaimedMission`` says what comes with each).

        Due = active, ``next_run_at`` at or before now, no live lease, and no pending approval
        request that has not expired (a parked run waits for its decision) unless the deadline
        passed (then the mission is claimed to be completed, which ends the parked run). A
        mission whose scheduled run finished already, or lies past its deadline, comes without
        an iteration; a run parked for approval is taken over like an interrupted one. Returns
        ``[]`` when ``limit`` < 1; oldest ``scheduled_for`` first.

        Never repeated by the store when its answer is lost (the connection broke once it was
        sent): the error is raised, and what that step may have claimed waits for its lease
        to expire, as after a crash, where a repeat would claim more on top.
        """
        ...

    async def resume_details(self, iteration: StartedIteration) -> StartedIteration:
        """``iteration`` with what a takeover needs besides the checkpoint on its row (the
        last stored round's calls and the compactions so far); unchanged unless it is
        ``resumable``."""
        ...

    async def renew_leases(
        self, mission_ids: Collection[int], *, worker_id: str, lease: timedelta
    ) -> set[int]:
        """Push the leases of ``mission_ids`` that ``worker_id`` still owns ``lease`` past
        now, in one step; return those ids (the others were taken over: their runs must
        stop)."""
        ...

    async def record_call_start(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
        reserve: tuple[RateLimit, str, bool] | None = None,
    ) -> CallStart:
        """Before a write or destructive call runs: store ``checkpoint`` and ``rows`` (the
        last one the call's ``started`` row) under the lease, in one step; with ``reserve``
        = ``(limit, consumer, run_anyway)``, reserve the call's rate-limit slot first and
        store its ``started`` row only when one was taken or ``run_anyway``.

        Raises:
            LeaseLostError: ``worker_id`` no longer owns the mission (nothing was stored).
        """
        ...

    async def run_effect(
        self,
        mission: ClaimedMission,
        row_id: int,
        effect: Callable[[Any], Awaitable[Any]],
        *,
        worker_id: str,
    ) -> Any:
        """Run a call's ``effect`` (``ToolSpec.effect``: ``connection -> result``) and store
        the call's outcome, ``ok`` with the result, on its ``started`` row ``row_id``, in one
        transaction under the lease: both commit or neither does, so a call whose row still
        says ``started`` never took effect. The effect's result.

        Raises:
            LeaseLostError: ``worker_id`` no longer owns the mission, or the row is no longer
                this run's ``started`` one (a takeover made the call its own); nothing is
                committed.
            Whatever ``effect`` raises (nothing is committed; the call's error is stored
            with the run's next write).
        """
        ...

    async def commit_round(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
    ) -> dict[tuple[int, int], int] | None:
        """Store a round (``checkpoint`` and ``rows``) under the lease, in one step; the new
        rows' ids by ``(round, position)``, or ``None`` (nothing stored) when ``worker_id`` no
        longer owns the mission."""
        ...

    async def finish_iteration(
        self,
        mission: ClaimedMission,
        iteration_id: int | None,
        outcome: IterationOutcome,
        *,
        worker_id: str,
        attempt: int = 1,
        claim: ClaimOrder | None = None,
    ) -> bool:
        """Store the end of a run (``outcome``: the iteration, its calls and compactions) and
        the mission's next run, and release the lease, in one step; ``iteration_id=None``
        only advances the schedule (and ends a run of the mission that was parked for an
        approval as ``failed`` / ``deadline_passed``: it is not resumed past the deadline). A
        paused mission stays paused. False (nothing stored) when
        ``worker_id`` no longer owns the mission; a repeat by ``attempt`` after a stored
        finish returns True.

        With ``claim``, the same step also claims other due missions for ``worker_id``
        (``ClaimOrder``), whether or not the lease held: the claim is the worker's, for the
        slot this run frees. Such a step is never repeated by the store when its answer is
        lost (as ``claim_due``); without ``claim`` it may be, once (it finds itself stored)."""
        ...

    async def interrupt_iteration(
        self,
        mission: ClaimedMission,
        iteration_id: int | None,
        *,
        worker_id: str,
        reason: str,
        checkpoint: RoundCheckpoint | None = None,
        invocations: Sequence[ToolInvocationRow] = (),
        attempt: int = 1,
    ) -> bool:
        """Store the run as ``failed`` / ``interrupted`` with ``checkpoint`` and
        ``invocations``, and release the lease without advancing the schedule (the next claim
        takes the same scheduled run over), in one step. False when ``worker_id`` no longer
        owns the mission; a repeat by ``attempt`` after a stored interruption returns True."""
        ...

    async def park_iteration(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        request: ApprovalRequestRow,
        *,
        worker_id: str,
        checkpoint: RoundCheckpoint,
        invocations: Sequence[ToolInvocationRow] = (),
        attempt: int = 1,
    ) -> ParkedRun | None:
        """Park the run at the call ``request`` is about, in one step: store ``checkpoint``
        and ``invocations`` (the parked call's row among them, outcome ``parked``), the
        iteration as ``awaiting_approval``, the approval request (unless the iteration's call
        at that round and position has one already: a call is asked about once), and release
        the lease without advancing the schedule. Until the request is decided or expires,
        ``claim_due`` leaves the mission alone; then the next claim takes the run over and
        ``resume_details`` gives it the decision. ``None`` (nothing stored) when ``worker_id``
        no longer owns the mission; safe to repeat."""
        ...
