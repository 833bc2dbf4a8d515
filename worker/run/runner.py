"""Run one claimed mission: tools → planner loop → stored iteration → next run.

The runner is the composition point for one iteration. It computes the mission's next run
first (a broken stored schedule pauses the mission with the error instead of looping), takes
over or creates the iteration row, renews the lease while the loop runs, and stores the
outcome together with the next run in one statement. Every write is retried while the lease
holds when the database fails transiently (``HeldLease.retry``); ``store_failed`` is only for
data the database refuses. Outcomes:

* ``succeeded`` — the loop ended with ``final_answer`` or ``max_rounds``.
* ``failed`` — the LLM could not answer (after retries), its answer was cut, filtered or
  empty (``planner.replies``), a required MCP server could not be used
  (``tool_source_unavailable``), or the run itself crashed; the iteration carries the reason,
  the mission keeps its schedule.
* ``interrupted`` — the worker shut down before the run finished, or its database stayed
  unreachable while the lease held (a write could not be journaled or gated, a tool's own
  database failed, the end could not be stored): the run is stored as interrupted when that
  is possible, else left as it is, and the next claim resumes it from its last checkpoint.
  Infrastructure faults are the runner's to recover: the model is never told to try again,
  and an iteration whose writes could not run never ends ``succeeded``.
* ``lease_lost`` — another worker took the mission over; nothing is written.
* ``skipped`` — the scheduled run already finished elsewhere, or the deadline passed.
* ``awaiting_approval`` — the gate asked a person about a destructive call
  (``MANA_AI_POLICY_DESTRUCTIVE=ask``): the run is parked with its checkpoint and an approval
  request, the lease released; once a person decides (or the request expires) the next claim
  resumes it from there (``worker.run.journal.resume_checkpoint``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from planner import (
    Approval,
    ChatModel,
    PlannerLoopInput,
    PlannerLoopResult,
    PolicyGate,
    ReminderChannel,
    RunEvent,
    RunInterrupted,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.compaction import Compactor
from planner.execution import DEFAULT_MAX_PARALLEL_READS, DEFAULT_TOOL_TIMEOUT_S
from planner.loop import ReminderRole
from planner.policy import POLICY_MODES, DestructivePolicy, PolicyMode
from planner.replies import StopReason
from planner.tools import ToolHandler
from worker import metrics, redaction
from worker.logs import bind_log_context
from worker.mcp.config import mcp_scope
from worker.mcp.sources import McpToolSources, ToolSourceError
from worker.policy_setup import PolicySetup
from worker.run.claim_ahead import ClaimAhead, FinishClaim
from worker.run.compaction_setup import CompactionSetup
from worker.run.journal import CHECKPOINT_EVERY_ROUNDS, MissionJournal, resume_checkpoint
from worker.run.leases import HeldLease, LeaseKeeper
from worker.run.mission_gate import LeaseBoundLedger, MissionGate
from worker.run.outcomes import (
    NextRun,
    approval_request,
    degraded,
    failed_outcome,
    loop_outcome,
    next_run_of,
    no_run,
    notice_fields,
    unconfirmed_approvals,
)
from worker.run.reminder_channel import mission_reminder_channel
from worker.run.run_metrics import RunMetrics, count_calls
from worker.store.base import (
    ClaimedMission,
    IterationOutcome,
    LeaseLostError,
    MissionStore,
    StartedIteration,
)
from worker.store.rows import json_safe, parked_row
from worker.store.statuses import IterationStatus, MissionStatus, RunnerStopReason
from worker.store.transient import describe_error, is_transient, retry_transient
from worker.tracing.hooks import RunTracing, traced_run

__all__ = ["MissionRunner", "RunOutcome", "ToolsFactory"]

logger = logging.getLogger(__name__)

ToolsFactory = Callable[[ClaimedMission], Sequence[ToolSpec]]
"""``mission -> tools`` the mission's agent may call (already filtered to its allow-list)."""


class RunOutcome(StrEnum):
    """How ``MissionRunner.run`` went (the ``outcome`` label of ``mana_ai_missions_run_total``):
    ``succeeded`` / ``failed`` (stored as such), ``interrupted`` (stored to resume later, or
    left to the lease's expiry), ``lease_lost`` (another worker holds it; nothing written),
    ``skipped`` (no run was due: the scheduled run had finished already),
    ``awaiting_approval`` (parked until a person decides on a call); ``error`` (the run
    raised: only ``Worker.run_once`` reports it)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    LEASE_LOST = "lease_lost"
    SKIPPED = "skipped"
    AWAITING_APPROVAL = "awaiting_approval"
    ERROR = "error"


SHUTDOWN_STORE_S = 5.0
"""Seconds a run interrupted by shutdown keeps trying to store its interruption; past it the
mission is left to whoever claims it once its lease expires (the takeover resumes it)."""

_TIMED_SPECS = 1024
"""Specs ``MissionRunner._offered`` keeps with the worker's timeout (the built-in tools are a
handful; a ``tools_for`` that makes new specs per mission clears the cache now and then)."""

BUDGET_WINDOW = timedelta(hours=24)
"""An agent's ``max_tokens_per_day`` is checked against its iterations of the last 24 hours
(a rolling window), before each run; a run that starts under budget may end over it."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class MissionRunner:
    """Runs claimed missions for one worker.

    Args:
        store: the database seam.
        llm: the chat model every mission uses (the agent's ``model`` is passed per request).
        tools_for: builds the tool list for a mission.
        worker_id: this worker's lease owner id.
        lease: lease length; renewed every ``lease / 3`` while a mission runs.
        default_model: model name when the agent sets none (``None`` = provider default).
        policy: the policy gate's setup; ``None`` runs every call without a gate (mode off).
        reminders: send the reminder channel's hints with each request (default on).
        reminders_disabled: reminder producers to leave out (``reminders.PRODUCER_NAMES``).
        checkpoint_every: commit a run's read-only rounds at least this often (rounds that
            ran a write or destructive call are always committed; default 3).
        reminder_role: the role reminders are sent with (``system`` or ``user``).
        compaction: how missions compact their context; ``None``: never.
        clock: returns the current UTC-aware time (injectable for tests).
        max_parallel_reads: read calls of one round running at once, at most (default 10).
        tool_timeout_s: seconds a tool call may run unless its ToolSpec says otherwise
            (default 60).
        tool_sources: opens the agent's MCP servers at the start of each iteration and adds
            their tools (``None``: an agent's MCP servers are not used, and the iteration
            says so).
        tracing: traces each run of the loop (``worker.tracing``); ``None``: off.
    """

    def __init__(
        self,
        *,
        store: MissionStore,
        llm: ChatModel,
        tools_for: ToolsFactory,
        worker_id: str,
        lease: timedelta,
        default_model: str | None = None,
        policy: PolicySetup | None = None,
        reminders: bool = True,
        reminders_disabled: Collection[str] = (),
        checkpoint_every: int = CHECKPOINT_EVERY_ROUNDS,
        reminder_role: ReminderRole = "system",
        compaction: CompactionSetup | None = None,
        clock: Callable[[], datetime] = _utcnow,
        max_parallel_reads: int = DEFAULT_MAX_PARALLEL_READS,
        tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
        tool_sources: McpToolSources | None = None,
        tracing: RunTracing | None = None,
    ) -> None:
        self.store = store
        self.llm = llm
        self.tools_for = tools_for
        self.worker_id = worker_id
        self.lease = lease
        self.default_model = default_model
        self.policy = policy
        self.reminders = reminders
        self.reminders_disabled = frozenset(reminders_disabled)
        self.checkpoint_every = checkpoint_every
        self.reminder_role: ReminderRole = reminder_role
        self.compaction = compaction
        self.clock = clock
        self.max_parallel_reads = max_parallel_reads
        self.tool_timeout_s = tool_timeout_s
        self.tool_sources = tool_sources
        self.tracing = tracing
        self.leases = LeaseKeeper(store, worker_id=worker_id, lease=lease)
        self.storing: set[asyncio.Future[Any]] = set()
        self._timed: dict[int, tuple[ToolSpec, ToolSpec]] = {}

    @contextlib.contextmanager
    def storing_end(self) -> Iterator[None]:
        """While the current run stores its end (its finish, a run skipped or a mission
        completed without a run, its park for an approval, its interruption), its task is in
        ``storing``: a stop does not cancel it then
        (``worker.daemon.tick.Worker.drain`` waits a few seconds), since a statement sent
        commits whether or not its answer is awaited, and a run that cannot tell whether its
        end was stored, or a finish whose claim went unseen, leaves missions leased until their
        lease expires. The mark covers the retries' waits too: a database back within those
        seconds still gets the end."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self.storing.add(task)
        try:
            yield
        finally:
            self.storing.discard(task)

    async def run(self, mission: ClaimedMission, *, ahead: ClaimAhead | None = None) -> RunOutcome:
        """Run ``mission`` once and store the result; the finish claims the worker's next
        missions when ``ahead`` orders it (``worker.run.claim_ahead``). Never raises except
        on cancellation that is not a lease loss (shutdown), after recording the
        interruption."""
        bind_log_context(mission_id=mission.id, iteration_id=None)
        started = time.perf_counter()
        outcome = await self._run(mission, ahead)
        metrics.MISSIONS_RUN.labels(outcome=outcome).inc()
        metrics.ITERATION_DURATION.observe(time.perf_counter() - started)
        return outcome

    async def _run(self, mission: ClaimedMission, ahead: ClaimAhead | None) -> RunOutcome:
        lease = self.leases.hold(mission.id, asyncio.current_task())
        try:
            return await self._run_held(mission, lease, ahead)
        except Exception as exc:
            if not is_transient(exc):
                raise
            # a database failure outside the loop (reading the checkpoint, a skipped run's
            # store) that outlasted the lease: whoever claims the mission next runs it
            logger.error(
                "the database did not answer while the lease held (%s); the mission is left "
                "to whoever claims it once its lease expires",
                describe_error(exc),
            )
            return RunOutcome.INTERRUPTED
        finally:
            self.leases.release(mission.id)

    async def _run_held(
        self, mission: ClaimedMission, lease: HeldLease, ahead: ClaimAhead | None
    ) -> RunOutcome:
        now = self._database_clock(mission)()
        next_run = next_run_of(mission, now)
        if mission.missed:  # a missed run the catch-up policy drops: the claim started none
            logger.warning(
                "run due at %s missed by %s; not run (catch-up policy %s); next run at %s",
                mission.scheduled_for.isoformat(),
                now - mission.scheduled_for,
                mission.catch_up,
                next_run.at.isoformat() if next_run.at else None,
            )
            metrics.MISSED_RUNS.labels(catch_up=mission.catch_up).inc()
            skipped = no_run(next_run)
            await self._end_without_run(mission, skipped, lease, what="skipping a missed run")
            return RunOutcome.SKIPPED
        if mission.past_deadline:
            logger.info("deadline %s passed; completing mission without a run", mission.deadline)
            done = no_run(NextRun(None, MissionStatus.COMPLETED))
            await self._end_without_run(mission, done, lease, what="completing the mission")
            return RunOutcome.SKIPPED

        model = mission.model or self.default_model
        iteration = mission.iteration  # claim_due started it
        if iteration is not None and iteration.resumable:
            started = iteration
            try:
                iteration = await lease.retry(
                    lambda: self.store.resume_details(started), what="reading the checkpoint"
                )
            except asyncio.CancelledError:  # this attempt took the run over already
                if (lost := await self._cancelled(mission, started, None, lease)) is not None:
                    return lost
                raise
        if iteration is None:
            logger.warning(
                "run for %s already finished or lease lost; advancing", mission.scheduled_for
            )
            skipped = no_run(next_run)
            await self._end_without_run(mission, skipped, lease, what="advancing the schedule")
            return RunOutcome.SKIPPED
        bind_log_context(iteration_id=iteration.id)
        logger.info(
            "iteration started (attempt %d, scheduled for %s)",
            iteration.attempt,
            mission.scheduled_for.isoformat(),
        )

        used = 0
        checkpoint_tokens = iteration.prompt_tokens + iteration.completion_tokens
        if mission.max_tokens_per_day is not None:
            # the claim read the tokens of the agent's other iterations
            used = (mission.tokens_used_24h or 0) + checkpoint_tokens
            if used >= mission.max_tokens_per_day:
                error = (
                    f"daily token budget used up: agent {mission.agent_name} used {used} of "
                    f"{mission.max_tokens_per_day} tokens in the last 24 h; run skipped"
                )
                if next_run != (caught_up := next_run_of(mission, now, catch_up=False)):
                    # no catch-up past the budget: the runs missed before now are dropped
                    error += "; the missed runs before now are dropped (catch-up policy all)"
                    next_run = caught_up
                logger.warning("%s", error)
                over = no_run(
                    next_run,
                    status=IterationStatus.FAILED,
                    stop_reason=RunnerStopReason.BUDGET_EXHAUSTED,
                    error=error,
                )
                stored, _ = await self._store(mission, iteration, over, lease, ahead)
                return RunOutcome.FAILED if stored else RunOutcome.INTERRUPTED

        result: PlannerLoopResult | None = None
        compactor = self.compaction.compactor_for(mission, model) if self.compaction else None
        run = _Run(
            MissionJournal(
                store=self.store,
                mission=mission,
                iteration=iteration,
                worker_id=self.worker_id,
                policy_mode=self._policy_mode(mission),
                specs={},
                checkpoint_every=self.checkpoint_every,
                lease=lease,
                archived=iteration.compaction_attempts,
                summariser=compactor.model if compactor is not None else None,
            )
        )
        channel = None
        if self.reminders:
            channel = mission_reminder_channel(
                max_tokens_per_day=mission.max_tokens_per_day,
                # the loop adds its usage, which starts from the checkpoint's on a resume
                tokens_used_24h=max(0, used - checkpoint_tokens),
                deadline=mission.deadline,
                clock=self._database_clock(mission),
                disabled=self.reminders_disabled,
                role=self.reminder_role,
            )
        try:
            result = await self._run_loop(mission, iteration, model, run, channel, compactor)
            problems = [*run.source_problems, *unconfirmed_approvals(run.standing, result)]
            outcome = loop_outcome(result, next_run, run.journal, problems)
        except asyncio.CancelledError:
            if (lost := await self._cancelled(mission, iteration, run.journal, lease)) is not None:
                return lost
            raise
        except Exception as exc:
            fault = exc if isinstance(exc, RunInterrupted) or is_transient(exc) else None
            if isinstance(exc, LeaseLostError) or (fault is not None and lease.lost.is_set()):
                metrics.LEASES_LOST.inc()
                logger.error("lease lost while running; another worker owns the mission now")
                return RunOutcome.LEASE_LOST
            if fault is None and not isinstance(exc, ToolSourceError):
                logger.exception("iteration crashed")
            if fault is not None:  # infrastructure: the runner's to recover, not the model's
                lease.detach()
                detail = str(fault) if isinstance(fault, RunInterrupted) else describe_error(fault)
                logger.warning("iteration interrupted: %s; it resumes from its checkpoint", detail)
                await self._interrupt(
                    mission,
                    iteration,
                    run.journal,
                    lease,
                    reason=json_safe(
                        f"interrupted: {detail} (worker {self.worker_id}); the run resumes "
                        "from its last checkpoint"
                    ),
                )
                return RunOutcome.INTERRUPTED
            outcome = failed_outcome(exc, next_run, run.journal)
        lease.detach()
        if result is not None and result.stop_reason == StopReason.AWAITING_APPROVAL:
            parked = await self._park(mission, iteration, run, lease, result)
            if parked is not None:
                return parked
            # the database refused the park: stored as a failure, never asked again for ever
            outcome = dataclasses.replace(
                failed_outcome(RuntimeError("refused"), next_run, run.journal),
                stop_reason=RunnerStopReason.STORE_FAILED,
                error="could not park the run for approval: the database refused it (see the "
                "worker's log)",
            )
        stored, outcome = await self._store(mission, iteration, outcome, lease, ahead)
        if stored is None:
            return RunOutcome.INTERRUPTED
        if not stored:
            metrics.LEASES_LOST.inc()
            logger.error("lease lost before the iteration could be stored; result dropped")
            return RunOutcome.LEASE_LOST
        if result is not None:
            count_calls(result.record, run.tool_names)
        logger.info(
            "iteration %s: stop_reason=%s rounds=%d tokens=%d next_run_at=%s error=%s",
            outcome.status,
            outcome.stop_reason,
            outcome.rounds,
            outcome.prompt_tokens + outcome.completion_tokens,
            outcome.next_run_at.isoformat() if outcome.next_run_at else None,
            outcome.error,
        )
        return RunOutcome(outcome.status)

    async def _store(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        outcome: IterationOutcome,
        lease: HeldLease,
        ahead: ClaimAhead | None = None,
    ) -> tuple[bool | None, IterationOutcome]:
        """Store the end of the run (``finish_iteration``), retrying transient failures for
        as long as the lease allows; with the outcome stored. True: stored; False: the lease
        was lost (nothing written); ``None``: the database stayed unreachable, or refused even
        the bare failure, and the run is left to a takeover, which resumes it from its last
        checkpoint.

        Data the database refuses (not a transient failure) is stored as ``failed`` /
        ``store_failed`` with as much as it takes (``_degraded``): never retried, so that a
        run whose tools already acted is not run again for ever.
        """

        claim = FinishClaim(ahead)

        def finish(done: IterationOutcome) -> Callable[[], Awaitable[bool]]:
            return lambda: claim.send(
                lambda order: self.store.finish_iteration(
                    mission,
                    iteration.id,
                    done,
                    worker_id=self.worker_id,
                    attempt=iteration.attempt,
                    claim=order,
                )
            )

        # a stop waits for this end (``storing_end``); the claim is settled however it ends
        with self.storing_end(), contextlib.closing(claim):
            refusal: Exception | None = None
            for attempt in itertools.chain((outcome,), degraded(outcome)):
                if refusal is not None:
                    attempt = dataclasses.replace(
                        attempt,
                        # the cause, not SQLAlchemy's dump of the statement and its parameters
                        error=f"could not store the iteration: {describe_error(refusal)}"[:500],
                    )
                try:
                    return await lease.retry(finish(attempt), what="storing the iteration"), attempt
                except Exception as exc:
                    if is_transient(exc):
                        logger.error(
                            "could not store the iteration: the database did not answer while the "
                            "lease held (%s); the run is left to a takeover, which resumes it from "
                            "its last checkpoint",
                            describe_error(exc),
                        )
                        return None, attempt
                    logger.exception(
                        "the database refused the iteration; storing the failure with less of it"
                    )
                    refusal = refusal or exc
            logger.error(
                "the database refused even the bare failure; the run is left to a takeover"
            )
            return None, outcome

    async def _end_without_run(
        self, mission: ClaimedMission, done: IterationOutcome, lease: HeldLease, *, what: str
    ) -> None:
        """Store ``done``, the end of a scheduled run that never ran (``finish_iteration``
        with no iteration), retrying transient failures while the lease holds."""
        with self.storing_end():
            await lease.retry(
                lambda: self.store.finish_iteration(mission, None, done, worker_id=self.worker_id),
                what=what,
            )

    async def _park(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        run: _Run,
        lease: HeldLease,
        result: PlannerLoopResult,
    ) -> RunOutcome | None:
        """Store the run parked at the call the gate asked about: its checkpoint, the calls so
        far with the parked one (``parked``), the approval request, ``awaiting_approval``,
        the lease released (``MissionStore.park_iteration``), retrying transient failures
        while the lease holds; then tell the webhook of a new request. When the database does
        not answer, the mission is left to whoever claims it once its lease expires (that run
        asks again); ``None`` when it refused the data (the caller stores a failure)."""
        parked = result.record.pending_approval
        assert parked is not None, "a run awaiting approval has its request"
        journal = run.journal
        policy = self.policy
        assert policy is not None, "only a gate asks for approvals"
        key = (parked.round, parked.position)
        ctx = ToolContext(user_id=mission.owner_user_id, iteration_id=iteration.id)
        row = parked_row(
            parked,
            attempt=iteration.attempt,
            idempotency_key=ctx.for_call(*key).idempotency_key,
            policy_mode=journal.policy_mode,
        )
        rows = [*journal.pending_rows(), replace(row, row_id=journal.rows.ids.get(key))]
        request = approval_request(mission, iteration, parked, ttl=policy.approval_ttl)
        checkpoint = journal.checkpoint()
        try:
            with self.storing_end():
                stored = await lease.retry(
                    lambda: self.store.park_iteration(
                        mission,
                        iteration.id,
                        request,
                        worker_id=self.worker_id,
                        checkpoint=checkpoint,
                        invocations=rows,
                        attempt=iteration.attempt,
                    ),
                    what="parking the run for approval",
                )
        except Exception as exc:
            if not is_transient(exc):
                logger.exception("could not park the run for approval: the database refused it")
                return None
            logger.error(
                "could not park the run for approval: the database did not answer while the "
                "lease held (%s); the mission is left to whoever claims it once its lease "
                "expires, which asks again",
                describe_error(exc),
            )
            return RunOutcome.INTERRUPTED
        if stored is None:
            metrics.LEASES_LOST.inc()
            logger.error("lease lost before the run could be parked for approval; dropped")
            return RunOutcome.LEASE_LOST
        count_calls(result.record, run.tool_names)
        logger.warning(
            "iteration parked after round %d: %s needs a person's approval (approval request "
            "%d, %s; expires %s): `mana-ai approvals approve %d` or `deny %d`",
            parked.round,
            parked.call.name,
            stored.request_id,
            "new" if stored.created else "asked before",
            stored.expires_at.isoformat(),
            stored.request_id,
            stored.request_id,
        )
        if stored.created:
            metrics.APPROVAL_REQUESTS.labels(consumer="mission").inc()
            if policy.webhook is not None:
                policy.webhook.notify(
                    notice_fields(request, stored.request_id, expires_at=stored.expires_at)
                )
        return RunOutcome.AWAITING_APPROVAL

    async def _cancelled(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        journal: MissionJournal | None,
        lease: HeldLease,
    ) -> RunOutcome | None:
        """A run of ``iteration`` was cancelled: by its lease keeper, when the lease was lost
        (``LEASE_LOST``, the cancellation taken back: another worker owns the mission), else by
        a shutdown, whose interruption is stored (``_interrupt``, at most
        ``SHUTDOWN_STORE_S``) before ``None`` tells the caller to let the cancellation go on."""
        this_task = asyncio.current_task()
        if lease.lost.is_set() and this_task is not None:
            this_task.uncancel()
            metrics.LEASES_LOST.inc()
            logger.error("lease lost while running; another worker owns the mission now")
            return RunOutcome.LEASE_LOST
        lease.detach()
        await self._interrupt(
            mission,
            iteration,
            journal,
            lease,
            reason=f"interrupted: worker {self.worker_id} shut down before the run finished",
            within_s=SHUTDOWN_STORE_S,
        )
        logger.warning("iteration interrupted by shutdown; the next worker resumes it")
        metrics.MISSIONS_RUN.labels(outcome="interrupted").inc()
        return None

    async def _interrupt(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        journal: MissionJournal | None,
        lease: HeldLease,
        *,
        reason: str,
        within_s: float | None = None,
    ) -> bool:
        """Store the run as interrupted with its checkpoint and release the lease, so the next
        claim resumes it (``interrupt_iteration``), retrying transient failures while the
        lease holds, for at most ``within_s`` seconds when given (each statement's wait
        included). ``journal``: the run's, ``None`` when it never began (the checkpoint
        stored so far stays). False when that failed: the mission is then left to whoever
        claims it once its lease expires."""
        checkpoint = journal.checkpoint() if journal is not None else None
        rows = journal.pending_rows() if journal is not None else ()

        def interrupt() -> Awaitable[bool]:
            return self.store.interrupt_iteration(
                mission,
                iteration.id,
                worker_id=self.worker_id,
                reason=reason,
                checkpoint=checkpoint,
                invocations=rows,
                attempt=iteration.attempt,
            )

        deadline = lease.expires_at
        if within_s is not None:
            deadline = min(deadline, time.monotonic() + within_s)
        try:
            # the deadline bounds the waits between tries; the timeout, a try that hangs
            with self.storing_end():
                async with asyncio.timeout(within_s):
                    return await retry_transient(
                        interrupt, deadline=deadline, what="storing the interruption"
                    )
        except Exception as exc:
            logger.error(
                "could not store the interruption (%s); the mission is left to whoever claims "
                "it once its lease expires",
                describe_error(exc),
            )
            return False

    async def _run_loop(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        model: str | None,
        run: _Run,
        channel: ReminderChannel | None,
        compactor: Compactor | None,
    ) -> PlannerLoopResult:
        ctx = ToolContext(
            user_id=mission.owner_user_id,
            agent_id=mission.agent_id,
            mission_id=mission.id,
            iteration_id=iteration.id,
        )
        journal = run.journal
        lease = journal.lease
        gate: PolicyGate | None = None
        if self.policy is not None and lease is not None:
            rules = self.policy.gate(
                user_settings=mission.user_policy,
                mode=_policy_mode_or_none(mission.policy_mode),
                destructive=_destructive_or_none(mission.destructive_policy),
                # enforce: an unreachable ledger interrupts the run instead of denying calls
                # (log-only fails open at once: it must never hold a call up)
                ledger=(
                    LeaseBoundLedger(self.policy.ledger, lease)
                    if self._policy_mode(mission) == "enforce"
                    else None
                ),
            )
            gate = MissionGate(rules, journal) if rules is not None else None
        tools = self._offered(mission)
        async with contextlib.AsyncExitStack() as sources:  # MCP sessions: this run only
            opened = await self._open_tool_sources(mission, sources, tools, run.source_problems)
            tools += [self._with_timeout(t) for t in opened]
            run.tool_names = frozenset(t.name for t in tools)
            tools = [journal.bound(t) for t in tools]
            journal.specs = {t.name: t for t in tools}
            resume = None
            if iteration.resumable:
                resume, journal.rows = await resume_checkpoint(
                    iteration, specs=journal.specs, ctx=ctx
                )
                run.standing = tuple(resume.standing_approvals)
                unknown = sum(c.outcome_unknown for c in resume.settled.values())
                decided = ", ".join(
                    f"request {a.request_id} {a.status.value}" for a in resume.approvals.values()
                )
                if decided and not unknown:  # a parked run going on: routine, not a fault
                    logger.info(
                        "resuming after round %d with the decision on its approval (%s)",
                        resume.rounds_done,
                        decided,
                    )
                else:
                    logger.warning(
                        "resuming after round %d of attempt %d (%d call(s) in flight with an "
                        "unknown outcome: not run again)",
                        resume.rounds_done,
                        iteration.attempt - 1,
                        unknown,
                    )
            inp = PlannerLoopInput(
                system_prompt=mission.system_prompt,
                user_prompt=mission.objective,
                tools=tools,
                max_rounds=mission.max_rounds,
                model=model,
                reminder_channel=channel,
                ctx=ctx,
                policy=gate,
                compactor=compactor,
                max_parallel_reads=self.max_parallel_reads,
                resume=resume,
            )
            observed = RunMetrics()

            def sink(event: RunEvent) -> Awaitable[None] | None:
                observed(event)
                return journal(event)

            async with traced_run(
                self.tracing, mission, iteration, model, sink, run.tool_names
            ) as traced:
                return await run_planner_loop(inp, llm=self.llm, sink=traced)

    def _database_clock(self, mission: ClaimedMission) -> Callable[[], datetime]:
        """The database's clock as this worker reads it for ``mission``'s run: ``clock`` moved
        by how far it was from the database's at the claim (``ClaimedMission.claimed_at``), so
        that a worker whose clock is off schedules, and reminds of deadlines, as the
        database's clock (the one the claim judges due by) says."""
        if mission.claimed_at is None:
            return self.clock
        offset = mission.claimed_at - self.clock()
        return lambda: self.clock() + offset

    def _with_timeout(self, spec: ToolSpec) -> ToolSpec:
        """``spec`` with the worker's tool timeout when it sets none of its own, and its
        results and errors with the process's secrets masked (``worker.redaction``: an MCP
        server or a page that echoes a key never hands it to the model)."""
        timeout_s = spec.timeout_s if spec.timeout_s is not None else self.tool_timeout_s
        return dataclasses.replace(spec, timeout_s=timeout_s, handler=_masking(spec.handler))

    def _offered(self, mission: ClaimedMission) -> list[ToolSpec]:
        """``tools_for(mission)`` with the worker's tool timeout, each spec made once per
        spec ``tools_for`` returns (a spec checks its schema when made, and compiles its
        validator on first use: per mission, that was a third of the runner's own CPU). The
        specs are kept by identity with the spec they came from, at most ``_TIMED_SPECS``."""
        offered = []
        for spec in self.tools_for(mission):
            kept = self._timed.get(id(spec))
            if kept is None or kept[0] is not spec:
                if len(self._timed) >= _TIMED_SPECS:
                    self._timed.clear()
                kept = self._timed[id(spec)] = (spec, self._with_timeout(spec))
            offered.append(kept[1])
        return offered

    async def _open_tool_sources(
        self,
        mission: ClaimedMission,
        stack: contextlib.AsyncExitStack,
        offered: Sequence[ToolSpec],
        problems: list[str],
    ) -> list[ToolSpec]:
        """The tools of the agent's MCP servers that missions may use; their sessions close
        with ``stack``. What was left out goes to ``problems``.

        Raises:
            ToolSourceError: a required server could not be used.
        """
        if not mission.mcp_servers:
            return []
        if self.tool_sources is None:
            problems.append(
                "the agent's MCP servers were not used: this worker has no MCP tool sources"
            )
            return []
        exposed = self.policy.config.exposed_scopes if self.policy is not None else None
        servers = []
        for server in mission.mcp_servers:
            if exposed is None or mcp_scope(server.name) in exposed:
                servers.append(server)
                continue
            reason = (
                f"MCP server {server.name} not used: its scope {mcp_scope(server.name)} is not "
                "in MANA_AI_POLICY_MISSION_SCOPES"
            )
            if server.required:
                raise ToolSourceError(f"{reason} (the server is required)")
            problems.append(reason)
        opened = await self.tool_sources.open(
            servers, stack, reserved=frozenset(t.name for t in offered)
        )
        problems.extend(opened.problems)
        return opened.tools

    def _policy_mode(self, mission: ClaimedMission) -> PolicyMode:
        """The policy mode this mission's calls run under (recorded on each invocation)."""
        if self.policy is None:
            return PolicyMode.OFF
        return _policy_mode_or_none(mission.policy_mode) or self.policy.default_mode


@dataclass
class _Run:
    """What one run keeps besides its record: the journal (which folds the record), the
    names of the tools it offered (metric labels), what its tool sources left out, and the
    approvals of calls whose outcome a takeover found unknown (``standing``)."""

    journal: MissionJournal
    tool_names: frozenset[str] = frozenset()
    source_problems: list[str] = field(default_factory=list)
    standing: tuple[Approval, ...] = ()


def _masking(handler: ToolHandler) -> ToolHandler:
    """``handler`` whose result (JSON data or text) and error message have the process's
    secrets masked (``worker.redaction``)."""

    async def handle(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            result = await handler(arguments, ctx)
        except Exception as exc:
            masking = redaction.redactor()
            if masking and masking.found(str(exc)):
                exc.args = tuple(masking.text(a) if isinstance(a, str) else a for a in exc.args)
            raise
        masking = redaction.redactor()
        if masking and isinstance(result, str | dict | list):
            return masking.json(result)
        return result

    return handle


def _policy_mode_or_none(value: str | None) -> PolicyMode | None:
    return PolicyMode(value) if value in POLICY_MODES else None


def _destructive_or_none(value: str | None) -> DestructivePolicy | None:
    return DestructivePolicy(value) if value in tuple(DestructivePolicy) else None
