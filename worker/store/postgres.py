"""The store seam on PostgreSQL (``worker.store.base.MissionStore``): every statement the tick,
the runner and the journal make.

* ``claim_due`` picks due, unleased (or lease-expired) active missions with
  ``FOR UPDATE SKIP LOCKED`` and stamps ``lease_owner`` / ``lease_expires_at`` in the same
  statement, so two workers never claim the same mission; the same statement starts or takes
  over their iterations and reads their agents' token use.
* Every later change is one statement conditional on ``lease_owner = worker_id``
  (``worker.store.writes``): a worker that lost its lease writes nothing.
* Lease times use the database clock (``now()``), never a worker's, so replicas with skewed
  clocks agree on expiry.

An iteration is keyed by ``(mission_id, scheduled_for)``. A run whose worker died leaves its
row ``running``; a run interrupted leaves it ``failed`` / ``interrupted``. Either is taken over
(``attempt`` + 1) by the next worker that claims the mission.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.gate import Reservation
from planner.policy import RateLimit
from worker.db.engine import run_statement
from worker.db.statuses import IterationStatus
from worker.db.tables import approval_requests, compacted_turns, missions, tool_invocations
from worker.store.base import LeaseLostError
from worker.store.claim import claim_limit, claim_parameters, claim_statement, claimed_mission
from worker.store.records import (
    CallStart,
    ClaimedMission,
    ClaimOrder,
    EndResult,
    Finished,
    Interrupted,
    IterationOutcome,
    NoRun,
    Parked,
    ParkedRun,
    RoundCheckpoint,
    RunEnd,
    StartedIteration,
    ToolInvocationRow,
)
from worker.store.rows import json_safe
from worker.store.writes import ends, params, progress

__all__ = ["PostgresMissionStore"]

logger = logging.getLogger(__name__)


class PostgresMissionStore:
    """The ``worker.store.base.MissionStore`` of PostgreSQL: mission, iteration and
    tool-invocation statements over one AsyncEngine.

    Every method opens its own short transaction; none holds a connection between calls.
    A method that writes with one statement (claiming, finishing, renewing) runs it with
    ``worker.db.engine.run_statement``: in autocommit, one round trip, since a statement is
    atomic by itself (in a transaction behind PgBouncer), and once more on another connection
    when the one it got is broken, unless it claims (``claim_due``, a finish with a
    ``ClaimOrder``): a claim run again would claim more.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def _run_one(
        self, stmt: Any, params: dict[str, Any] | None = None
    ) -> Sequence[RowMapping]:
        """Run one statement on its own (``run_statement``); its rows."""
        return await run_statement(self.engine, stmt, params)

    async def claim_due(
        self,
        *,
        worker_id: str,
        limit: int,
        lease: timedelta,
        default_model: str | None = None,
        budget_window: timedelta = timedelta(hours=24),
    ) -> list[ClaimedMission]:
        """Lease up to ``limit`` due missions (oldest ``next_run_at`` first) for ``lease``, and
        start their iterations, in one statement (one round trip in one transaction).

        Due = ``status = 'active'`` and ``next_run_at <= now()`` and no live lease. Each
        claimed mission comes with its started (or taken over) iteration, named after its
        agent's model or ``default_model``, and, when its agent has a daily token budget, the
        tokens of the agent's other iterations started within ``budget_window``
        (``ClaimedMission``). No iteration is started when the scheduled run is past the
        mission's deadline, or already finished. Returns ``[]`` when ``limit`` < 1.
        """
        if limit < 1:
            return []
        values = claim_parameters(
            worker_id=worker_id,
            limit=limit,
            lease=lease,
            default_model=default_model,
            budget_window=budget_window,
        )
        # not run again when its connection breaks under it: it may have claimed already
        rows = await run_statement(self.engine, claim_statement(limit), values, idempotent=False)
        claims = [claimed_mission(r) for r in rows]
        return sorted(claims, key=lambda m: m.scheduled_for)

    async def resume_details(self, iteration: StartedIteration) -> StartedIteration:
        """``iteration`` with what a takeover needs besides the checkpoint on its row: the
        ``tool_invocations`` rows of the last round stored (``pending_rows``), the compactions
        the earlier attempts did and tried, and the approval requests of the last round
        (``approvals``; a pending one past its time to live is stored as ``expired`` first).
        Unchanged (no query) unless it is ``resumable``."""
        if not iteration.resumable:
            return iteration
        turns = compacted_turns.c
        async with self.engine.begin() as conn:
            await conn.execute(_expire_lapsed_requests(iteration.id))
            found = await conn.execute(_last_round_requests(iteration))
            approvals = [dict(r) for r in found.mappings()]
            found = await conn.execute(_last_round_calls(iteration))
            pending = [dict(r) for r in found.mappings()]
            archived = (
                await conn.execute(
                    select(func.count(), func.count().filter(turns.error.is_(None))).where(
                        turns.iteration_id == iteration.id
                    )
                )
            ).one()
            latest = (
                await conn.execute(
                    select(turns.round, turns.tokens_after)
                    .where(turns.iteration_id == iteration.id, turns.error.is_(None))
                    .order_by(turns.compaction_index.desc())
                    .limit(1)
                )
            ).first()
        return dataclasses.replace(
            iteration,
            pending_rows=pending,
            compaction_attempts=int(archived[0]),
            compactions=int(archived[1]),
            last_compaction=(int(latest[0]), int(latest[1])) if latest is not None else None,
            approvals=approvals,
        )

    async def renew_leases(
        self, mission_ids: Collection[int], *, worker_id: str, lease: timedelta
    ) -> set[int]:
        """Push the leases of ``mission_ids`` ``lease`` past now, in one statement; return the
        ids this worker still owned (the others were taken over: their runs must stop)."""
        if not mission_ids:
            return set()
        stmt = (
            update(missions)
            .where(missions.c.id.in_(list(mission_ids)), missions.c.lease_owner == worker_id)
            .values(lease_expires_at=func.now() + lease)
            .returning(missions.c.id)
        )
        return {int(r["id"]) for r in await self._run_one(stmt)}

    async def run_effect(
        self,
        mission: ClaimedMission,
        row_id: int,
        effect: Callable[[Any], Awaitable[Any]],
        *,
        worker_id: str,
    ) -> Any:
        """See ``MissionStore.run_effect``: the effect, then one statement that marks the row
        when the lease is still this worker's, holding the mission's row ``FOR KEY SHARE``
        until the commit (a takeover's claim, ``FOR UPDATE SKIP LOCKED``, passes it by
        meanwhile; the lease renewal, which changes no key, is not held up): four round
        trips with BEGIN and COMMIT. Never run again by the store when its connection
        breaks: the run is interrupted and its takeover, which finds the row ``started``,
        runs the call again."""
        async with self.engine.begin() as conn:
            result = await effect(conn)
            # after the effect, in its transaction: the lease still this worker's (the
            # mission's row then held FOR KEY SHARE until the commit) and the row still the
            # call's started one, or nothing of it commits
            held = (
                select(missions.c.id)
                .where(
                    missions.c.id == mission.id,
                    missions.c.lease_owner == worker_id,
                    missions.c.lease_expires_at > func.now(),
                )
                .with_for_update(read=True, key_share=True)
                .cte("held")
            )
            marked = await conn.execute(
                update(tool_invocations)
                .where(
                    tool_invocations.c.id == row_id,
                    tool_invocations.c.outcome == "started",
                    select(held.c.id).exists(),
                )
                .values(outcome="ok", result=json_safe(result), error=None)
                .returning(tool_invocations.c.id)
            )
            if marked.first() is None:  # rolled back: the effect never happened
                raise LeaseLostError(
                    f"lease lost: mission {mission.id} is no longer this worker's, or its "
                    "call's record moved on (a takeover made the call its own)"
                )
        return result

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
        """Before a write or destructive call runs: store the log so far (it ends with the
        assistant message that issued the call), ``rows`` (the calls of the round not stored
        yet, the last one the call's ``started`` row) and the compactions of ``checkpoint``,
        in one statement under the lease (``writes.progress``). Safe to run again.

        With ``reserve`` = ``(limit, consumer, run_anyway)``, the statement first reserves the
        call's rate-limit slot (``mana_ai_reserve_tool_call``, as the ledger does), and stores
        the ``started`` row only when it was taken or ``run_anyway``.

        Raises:
            LeaseLostError: this worker no longer owns the mission (the call must not run).
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        values = params.progress(mission, iteration_id, checkpoint, rows, worker_id=worker_id)
        stmt = progress.checkpoint()
        if reserve is not None:
            limit, consumer, run_anyway = reserve
            stmt = progress.reserved_checkpoint()
            values |= {
                "p_user_id": mission.owner_user_id,
                "p_tool": rows[-1].tool,
                "p_consumer": consumer,
                "p_window": limit.window,
                "p_limit": limit.calls,
                "p_run_anyway": run_anyway,
            }
        [written] = await run_statement(self.engine, stmt, values)
        if not written["owned"]:
            raise LeaseLostError(f"mission {mission.id}: lease lost; the call was not run")
        reservation = None
        if reserve is not None:
            reservation = Reservation(
                reserved=bool(written["reserved"]),
                now=written["checked_at"],
                recent=tuple(written["recent"] or ()),
            )
        return CallStart(ids=params.new_ids(written), reservation=reservation)

    async def commit_round(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
    ) -> dict[tuple[int, int], int]:
        """The round commit: the log, rounds, tokens and reminders so far, the round's
        ``tool_invocations`` rows (new ones inserted, journaled ones brought up to date) and
        the compactions not stored yet, in one statement under the lease (``writes.progress``)
        — a checkpoint a takeover resumes from. The new rows' ids by ``(round, position)``.
        Safe to run again.

        Raises:
            LeaseLostError: this worker no longer owns the mission (nothing was written).
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        values = params.progress(mission, iteration_id, checkpoint, rows, worker_id=worker_id)
        [written] = await run_statement(self.engine, progress.checkpoint(), values)
        if not written["owned"]:
            raise LeaseLostError(f"mission {mission.id}: lease lost; the round was not committed")
        return params.new_ids(written)

    async def end_run(
        self,
        mission: ClaimedMission,
        end: RunEnd,
        *,
        worker_id: str,
        claim: ClaimOrder | None = None,
    ) -> EndResult:
        """See ``MissionStore.end_run``: one statement of ``worker.store.writes.ends`` per kind
        of end. Run once more on another connection when the one it got breaks under it
        (a repeat finds what the first stored), unless it claims.

        Raises:
            ValueError: a ``claim`` with an end other than ``Finished``.
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        if claim is not None and not isinstance(end, Finished):
            raise ValueError(f"only a finished run claims ahead, not {type(end).__name__}")
        stmt, values = _end_statement(mission, end, worker_id)
        if claim is not None:
            stmt = ends.finished_and_claimed(claim_limit(claim.limit))
            values |= claim_parameters(
                worker_id=worker_id,
                limit=claim.limit,
                lease=claim.lease,
                default_model=claim.default_model,
                budget_window=claim.budget_window,
            )
        # an end is conditional on the lease and keyed: run again, it finds itself stored;
        # a claim is not (``claim_due``)
        rows = await run_statement(self.engine, stmt, values, idempotent=claim is None)
        first = rows[0]
        held = bool(first["owned"]) or bool(first.get("stored"))
        claimed: tuple[ClaimedMission, ...] = ()
        if claim is not None:
            found = [claimed_mission(r) for r in rows if r["id"] is not None]
            claimed = tuple(sorted(found, key=lambda m: m.scheduled_for))
        parked = None
        if isinstance(end, Parked):
            held = held and first["approval_id"] is not None
            if held:
                parked = ParkedRun(
                    request_id=int(first["approval_id"]),
                    created=bool(first["approval_created"]),
                    expires_at=first["approval_expires_at"],
                )
        return EndResult(lease_held=held, claimed=claimed, parked=parked)


def _end_statement(
    mission: ClaimedMission, end: RunEnd, worker_id: str
) -> tuple[Any, dict[str, Any]]:
    """The statement of ``end`` and its parameters."""
    if isinstance(end, NoRun):
        outcome = IterationOutcome(
            status=IterationStatus.SUCCEEDED,
            messages=[],
            rounds=0,
            prompt_tokens=0,
            completion_tokens=0,
            stop_reason=None,
            error=end.error,
            next_run_at=end.next_run_at,
            mission_status=end.mission_status,
        )
        return ends.moved_on(), params.schedule(mission, outcome, worker_id=worker_id)
    if isinstance(end, Finished):
        outcome = end.outcome
        values = params.progress(
            mission,
            end.iteration_id,
            params.finished_checkpoint(outcome),
            outcome.tool_invocations,
            worker_id=worker_id,
        )
        values |= params.ended(end.attempt, outcome.status, outcome.stop_reason, outcome.error)
        values |= params.schedule(mission, outcome, worker_id=worker_id)
        return ends.finished(), values
    values = params.progress(
        mission, end.iteration_id, end.checkpoint, end.invocations, worker_id=worker_id
    )
    if isinstance(end, Interrupted):
        values |= params.ended(end.attempt, "failed", "interrupted", end.reason)
        return ends.interrupted(), values
    values |= params.ended(end.attempt, "awaiting_approval", "awaiting_approval", None)
    values |= params.approval(end.request)
    return ends.parked(), values


def _expire_lapsed_requests(iteration_id: int) -> Any:
    """The run's pending approval requests past their time to live become ``expired``."""
    requests = approval_requests.c
    return (
        update(approval_requests)
        .where(
            requests.iteration_id == iteration_id,
            requests.consumer == "mission",
            requests.status == "pending",
            requests.expires_at <= func.now(),
        )
        .values(status="expired", decided_at=requests.expires_at)
    )


def _last_round_requests(iteration: StartedIteration) -> Any:
    """The approval requests of the run's last stored round, by position."""
    requests = approval_requests.c
    return (
        select(
            requests.id,
            requests.position,
            requests.status,
            requests.tool,
            requests.arguments_hash,
            requests.decided_by,
            requests.decided_at,
            requests.decision_note,
            requests.target,
        )
        .where(
            requests.iteration_id == iteration.id,
            requests.consumer == "mission",
            requests.round == iteration.rounds,
        )
        .order_by(requests.position)
    )


def _last_round_calls(iteration: StartedIteration) -> Any:
    """The ``tool_invocations`` rows of the run's last stored round, oldest first."""
    calls = tool_invocations.c
    return (
        select(
            calls.id,
            calls.position,
            calls.outcome,
            calls.result,
            calls.error,
            calls.policy_decision,
        )
        .where(calls.iteration_id == iteration.id, calls.round == iteration.rounds)
        .order_by(calls.id)
    )
