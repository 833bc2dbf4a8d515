"""Run one claimed mission: what the run comes to (``Ending``), then that stored in one place.

``MissionRunner.run`` holds the mission's lease (renewed for every run of the worker by one
statement per period, ``worker.run.leases``), decides what the run comes to, and has the
``EndWriter`` store it (``worker.run.ending``: retries while the lease holds, less of it when
the database refuses it, a stop waiting for it). What a run comes to, as one
``worker.store.records.RunEnd``:

* ``NoRun``: a missed run its mission's catch-up policy drops, a mission completed past its
  deadline, or a scheduled run that finished already (the outcome ``skipped``);
* ``Finished``: the loop ended (``succeeded`` with a final answer or at ``max_rounds``;
  ``failed`` when the LLM could not answer, its answer was cut, filtered or empty, a required
  MCP server could not be used, the agent's daily token budget was used up, or the run itself
  crashed);
* ``Parked``: the gate asked a person about a destructive call
  (``MANA_AI_POLICY_DESTRUCTIVE=ask``): the run waits with its checkpoint and an approval
  request, the lease released (``awaiting_approval``);
* ``Interrupted``: the worker stops, or its database stayed unreachable while the lease held
  (a write could not be journaled or gated, a tool's own database failed): the next claim
  resumes the run from its last checkpoint. Infrastructure faults are the runner's to
  recover: the model is never told to try again, and a run whose writes could not run never
  ends ``succeeded``.

A run whose lease was lost (another worker took the mission over) stores nothing
(``lease_lost``). Time that decides anything is the database's clock
(``ClaimedMission.claimed_at``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta

from planner import ChatModel, PlannerLoopResult, RunInterrupted, StopReason, ToolContext
from planner.execution import DEFAULT_MAX_PARALLEL_READS, DEFAULT_TOOL_TIMEOUT_S
from planner.loop import ReminderRole
from worker import metrics
from worker.db.statuses import IterationStatus, MissionStatus, RunnerStopReason
from worker.db.transient import describe_error, is_transient
from worker.logs import bind_log_context
from worker.mcp.sources import McpToolSources, ToolSourceError
from worker.policy_setup import PolicySetup
from worker.run.compaction_setup import CompactionSetup
from worker.run.ending import SHUTDOWN_STORE_S, Ending, EndWriter, RunOutcome, RunResult
from worker.run.journal import CHECKPOINT_EVERY_ROUNDS, MissionJournal
from worker.run.leases import HeldLease, LeaseKeeper
from worker.run.mission_loop import MissionLoop, RunState, ToolsFactory
from worker.run.outcomes import (
    NextRun,
    approval_request,
    failed_outcome,
    loop_outcome,
    next_run_of,
    no_run,
    unconfirmed_approvals,
)
from worker.run.reminder_channel import mission_reminder_channel
from worker.store.base import LeaseLostError, MissionStore
from worker.store.records import (
    ClaimedMission,
    ClaimOrder,
    Finished,
    Interrupted,
    NoRun,
    Parked,
    StartedIteration,
)
from worker.store.rows import json_safe, parked_row
from worker.tracing.hooks import RunTracing

__all__ = [
    "BUDGET_WINDOW",
    "SHUTDOWN_STORE_S",
    "MissionRunner",
    "RunOutcome",
    "RunResult",
    "ToolsFactory",
]

logger = logging.getLogger(__name__)

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
        clock: returns the current UTC-aware time (injectable for tests); moved onto the
            database's clock per run.
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
        self.loop = MissionLoop(
            llm=llm,
            tools_for=tools_for,
            policy=policy,
            max_parallel_reads=max_parallel_reads,
            tool_timeout_s=tool_timeout_s,
            tool_sources=tool_sources,
            tracing=tracing,
        )
        self.leases = LeaseKeeper(store, worker_id=worker_id, lease=lease)
        self.ends = EndWriter(store, worker_id, policy)
        self.storing = self.ends.storing
        """The runs storing their end now: a stop waits for them (``Worker.drain``)."""

    async def run(self, mission: ClaimedMission, *, claim_ahead: int = 0) -> RunResult:
        """Run ``mission`` once and store how it ended; with ``claim_ahead``, a finish also
        claims up to that many of this worker's next due missions (``RunResult.claimed``:
        start them). Never raises except on cancellation that is not a lease loss (a stop),
        after storing the interruption."""
        bind_log_context(mission_id=mission.id, iteration_id=None)
        started = time.perf_counter()
        result = await self._run(mission, claim_ahead)
        metrics.MISSIONS_RUN.labels(outcome=result.outcome).inc()
        metrics.ITERATION_DURATION.observe(time.perf_counter() - started)
        return result

    async def _run(self, mission: ClaimedMission, claim_ahead: int) -> RunResult:
        lease = self.leases.hold(mission.id, asyncio.current_task())
        try:
            ending = await self._ending(mission, lease)
            if ending is None:
                return RunResult(RunOutcome.LEASE_LOST)
            claim = None
            if claim_ahead > 0 and isinstance(ending.end, Finished):
                claim = ClaimOrder(
                    limit=claim_ahead,
                    lease=self.lease,
                    default_model=self.default_model,
                    budget_window=BUDGET_WINDOW,
                )
            result = await self.ends.write(mission, ending, lease, claim)
            if ending.shutdown:
                logger.warning("iteration interrupted by shutdown; the next worker resumes it")
                metrics.MISSIONS_RUN.labels(outcome="interrupted").inc()
                raise asyncio.CancelledError
            return result
        except Exception as exc:
            if not is_transient(exc):
                raise
            # a database failure outside the loop (reading the checkpoint) that outlasted the
            # lease: whoever claims the mission next runs it
            logger.error(
                "the database did not answer while the lease held (%s); the mission is left "
                "to whoever claims it once its lease expires",
                describe_error(exc),
            )
            return RunResult(RunOutcome.INTERRUPTED)
        finally:
            self.leases.release(mission.id)

    async def _ending(self, mission: ClaimedMission, lease: HeldLease) -> Ending | None:
        """What the run comes to (``None``: its lease was lost; nothing to store)."""
        state = RunState()
        try:
            now = self._database_clock(mission)()
            next_run = next_run_of(mission, now)
            if mission.missed or mission.past_deadline:
                return self._no_run(mission, next_run, now)
            state.iteration = mission.iteration  # a stop while its details are read: stored
            state.iteration = await self._iteration(mission, lease)
            if state.iteration is None:
                logger.warning(
                    "run for %s already finished or lease lost; advancing", mission.scheduled_for
                )
                return Ending(_no_run_end(next_run))
            return await self._run_iteration(mission, state, next_run, lease)
        except asyncio.CancelledError:
            return self._cancelled(state, lease)

    def _no_run(self, mission: ClaimedMission, next_run: NextRun, now: datetime) -> Ending:
        """A missed run its catch-up policy drops, or a mission past its deadline."""
        if mission.missed:
            logger.warning(
                "run due at %s missed by %s; not run (catch-up policy %s); next run at %s",
                mission.scheduled_for.isoformat(),
                now - mission.scheduled_for,
                mission.catch_up,
                next_run.at.isoformat() if next_run.at else None,
            )
            metrics.MISSED_RUNS.labels(catch_up=mission.catch_up).inc()
            return Ending(_no_run_end(next_run))
        logger.info("deadline %s passed; completing mission without a run", mission.deadline)
        return Ending(NoRun(None, MissionStatus.COMPLETED))

    async def _iteration(
        self, mission: ClaimedMission, lease: HeldLease
    ) -> StartedIteration | None:
        """The claim's iteration, with what a takeover needs when it resumes one."""
        iteration = mission.iteration  # claim_due started it
        if iteration is None or not iteration.resumable:
            return iteration
        started = iteration
        return await lease.retry(
            lambda: self.store.resume_details(started), what="reading the checkpoint"
        )

    async def _run_iteration(
        self, mission: ClaimedMission, state: RunState, next_run: NextRun, lease: HeldLease
    ) -> Ending | None:
        iteration = state.iteration
        assert iteration is not None
        bind_log_context(iteration_id=iteration.id)
        logger.info(
            "iteration started (attempt %d, scheduled for %s)",
            iteration.attempt,
            mission.scheduled_for.isoformat(),
        )
        used = (mission.tokens_used_24h or 0) + iteration.prompt_tokens
        used += iteration.completion_tokens  # the claim read the agent's other iterations'
        budget = mission.max_tokens_per_day
        if budget is not None and used >= budget:
            return Ending(self._over_budget(mission, iteration, next_run, used))
        model = mission.model or self.default_model
        compactor = self.compaction.compactor_for(mission, model) if self.compaction else None
        state.journal = MissionJournal(
            store=self.store,
            mission=mission,
            iteration=iteration,
            worker_id=self.worker_id,
            policy_mode=self.loop.policy_mode(mission),
            specs={},
            checkpoint_every=self.checkpoint_every,
            lease=lease,
            archived=iteration.compaction_attempts,
            summariser=compactor.model if compactor is not None else None,
        )
        checkpoint_tokens = iteration.prompt_tokens + iteration.completion_tokens
        channel = None
        if self.reminders:
            channel = mission_reminder_channel(
                max_tokens_per_day=budget,
                # the loop adds its usage, which starts from the checkpoint's on a resume
                tokens_used_24h=max(0, used - checkpoint_tokens) if budget else 0,
                deadline=mission.deadline,
                clock=self._database_clock(mission),
                disabled=self.reminders_disabled,
                role=self.reminder_role,
            )
        try:
            result = await self.loop.run(mission, model, state, channel, compactor)
        except Exception as exc:
            return self._failed(mission, state, next_run, lease, exc)
        return self._loop_ended(mission, state, next_run, result)

    def _over_budget(
        self, mission: ClaimedMission, iteration: StartedIteration, next_run: NextRun, used: int
    ) -> Finished:
        """The run not run: the agent's daily token budget is used up."""
        error = (
            f"daily token budget used up: agent {mission.agent_name} used {used} of "
            f"{mission.max_tokens_per_day} tokens in the last 24 h; run skipped"
        )
        now = self._database_clock(mission)()
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
        return Finished(iteration.id, iteration.attempt, over)

    def _loop_ended(
        self,
        mission: ClaimedMission,
        state: RunState,
        next_run: NextRun,
        result: PlannerLoopResult,
    ) -> Ending:
        """What a loop that ended comes to: finished, or parked at a call a person must
        decide on."""
        iteration, journal = state.iteration, state.journal
        assert iteration is not None and journal is not None
        problems = [*state.source_problems, *unconfirmed_approvals(state.standing, result)]
        outcome = loop_outcome(result, next_run, journal, problems)
        finished = Finished(iteration.id, iteration.attempt, outcome)
        if result.stop_reason != StopReason.AWAITING_APPROVAL:
            return Ending(finished, result=result, tool_names=state.tool_names)
        parked = self._parked(mission, state, result)
        refused = dataclasses.replace(
            failed_outcome(RuntimeError("refused"), next_run, journal),
            stop_reason=RunnerStopReason.STORE_FAILED,
            error="could not park the run for approval: the database refused it (see the "
            "worker's log)",
        )
        instead = Finished(iteration.id, iteration.attempt, refused)
        return Ending(parked, instead=instead, result=result, tool_names=state.tool_names)

    def _parked(
        self, mission: ClaimedMission, state: RunState, result: PlannerLoopResult
    ) -> Parked:
        """The run parked at the call the gate asked about: its checkpoint, the calls so far
        with the parked one (``parked``), and the approval request."""
        iteration, journal, policy = state.iteration, state.journal, self.policy
        assert iteration is not None and journal is not None and policy is not None
        parked = result.record.pending_approval
        assert parked is not None, "a run awaiting approval has its request"
        key = (parked.round, parked.position)
        ctx = ToolContext(user_id=mission.owner_user_id, iteration_id=iteration.id)
        row = parked_row(
            parked,
            attempt=iteration.attempt,
            idempotency_key=ctx.for_call(*key).idempotency_key,
            policy_mode=journal.policy_mode,
        )
        row = dataclasses.replace(row, row_id=journal.rows.ids.get(key))
        return Parked(
            iteration.id,
            iteration.attempt,
            approval_request(mission, iteration, parked, ttl=policy.approval_ttl),
            journal.checkpoint(),
            (*journal.pending_rows(), row),
        )

    def _failed(
        self,
        mission: ClaimedMission,
        state: RunState,
        next_run: NextRun,
        lease: HeldLease,
        exc: Exception,
    ) -> Ending | None:
        """What a loop that raised comes to: nothing (its lease was lost), an interruption
        (the infrastructure failed: the runner's to recover, not the model's), or a failure
        (a required MCP server, a crash in our own code: what the run did is kept)."""
        iteration, journal = state.iteration, state.journal
        assert iteration is not None and journal is not None
        fault = exc if isinstance(exc, RunInterrupted) or is_transient(exc) else None
        if isinstance(exc, LeaseLostError) or (fault is not None and lease.lost.is_set()):
            metrics.LEASES_LOST.inc()
            logger.error("lease lost while running; another worker owns the mission now")
            return None
        if fault is not None:
            detail = str(fault) if isinstance(fault, RunInterrupted) else describe_error(fault)
            logger.warning("iteration interrupted: %s; it resumes from its checkpoint", detail)
            reason = json_safe(
                f"interrupted: {detail} (worker {self.worker_id}); the run resumes from its "
                "last checkpoint"
            )
            return Ending(self._interrupted(state, reason))
        if not isinstance(exc, ToolSourceError):
            logger.exception("iteration crashed")
        outcome = failed_outcome(exc, next_run, journal)
        return Ending(
            Finished(iteration.id, iteration.attempt, outcome), tool_names=state.tool_names
        )

    def _interrupted(self, state: RunState, reason: str) -> Interrupted:
        iteration, journal = state.iteration, state.journal
        assert iteration is not None
        return Interrupted(
            iteration.id,
            iteration.attempt,
            reason,
            journal.checkpoint() if journal is not None else None,
            journal.pending_rows() if journal is not None else (),
        )

    def _cancelled(self, state: RunState, lease: HeldLease) -> Ending | None:
        """The run was cancelled: by its lease keeper, when the lease was lost (``None``, the
        cancellation taken back: another worker owns the mission), else by a stop: its
        interruption, stored before the cancellation goes on."""
        task = asyncio.current_task()
        if lease.lost.is_set() and task is not None:
            task.uncancel()
            metrics.LEASES_LOST.inc()
            logger.error("lease lost while running; another worker owns the mission now")
            return None
        if state.iteration is None:
            raise asyncio.CancelledError  # nothing began: nothing to store
        reason = f"interrupted: worker {self.worker_id} shut down before the run finished"
        return Ending(self._interrupted(state, reason), shutdown=True)

    def _database_clock(self, mission: ClaimedMission) -> Callable[[], datetime]:
        """The database's clock as this worker reads it for ``mission``'s run: ``clock`` moved
        by how far it was from the database's at the claim (``ClaimedMission.claimed_at``), so
        that a worker whose clock is off schedules, and reminds of deadlines, as the
        database's clock (the one the claim judges due by) says."""
        if mission.claimed_at is None:
            return self.clock
        offset = mission.claimed_at - self.clock()
        return lambda: self.clock() + offset


def _no_run_end(next_run: NextRun) -> NoRun:
    return NoRun(next_run.at, next_run.mission_status, next_run.error)
