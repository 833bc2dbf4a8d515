"""The store seam on PostgreSQL (``worker.store.base.MissionStore``): every statement the tick,
the runner and the journal make.

* ``claim_due`` picks due, unleased (or lease-expired) active missions with
  ``FOR UPDATE SKIP LOCKED`` and stamps ``lease_owner`` / ``lease_expires_at`` in the same
  statement, so two workers never claim the same mission; the same statement starts or takes
  over their iterations and reads their agents' token use.
* Every later change is one statement conditional on ``lease_owner = worker_id``
  (``worker.store.round_writes``): a worker that lost its lease writes nothing.
* Lease times use the database clock (``now()``), never a worker's, so replicas with skewed
  clocks agree on expiry.

An iteration is keyed by ``(mission_id, scheduled_for)``. A run whose worker died leaves its
row ``running``; a run interrupted leaves it ``failed`` / ``interrupted``. Either is taken over
(``attempt`` + 1) by the next worker that claims the mission.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    func,
    null,
    select,
    update,
)
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.elements import Null

from planner.gate import Reservation
from planner.policy import RateLimit
from worker.store.base import (
    ApprovalRequestRow,
    ArchiveRow,
    CallStart,
    ClaimedMission,
    ClaimOrder,
    IterationOutcome,
    LeaseLostError,
    ParkedRun,
    RoundCheckpoint,
    StartedIteration,
    ToolInvocationRow,
)
from worker.store.claim import claim_parameters, claim_statement, claimed_mission
from worker.store.engine import run_statement
from worker.store.prepared import run_prepared
from worker.store.round_writes import APPROVAL_KEYS, MissionWrite, round_write_statement
from worker.store.rows import encoded_json, json_safe
from worker.store.tables import (
    approval_requests,
    compacted_turns,
    missions,
    tool_invocations,
)

__all__ = ["PostgresMissionStore", "invocation_outcome_values"]

logger = logging.getLogger(__name__)


class PostgresMissionStore:
    """The ``worker.store.base.MissionStore`` of PostgreSQL: mission, iteration and
    tool-invocation statements over one AsyncEngine.

    Every method opens its own short transaction; none holds a connection between calls.
    A method that writes with one statement (claiming, finishing, renewing) runs it with
    ``worker.store.engine.run_statement``: in autocommit, one round trip, since a statement is
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
        params = claim_parameters(
            worker_id=worker_id,
            limit=limit,
            lease=lease,
            default_model=default_model,
            budget_window=budget_window,
        )
        # not run again when its connection breaks under it: it may have claimed already
        rows = await run_prepared(self.engine, claim_statement(limit), params, idempotent=False)
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
        calls = tool_invocations.c
        turns = compacted_turns.c
        requests = approval_requests.c
        async with self.engine.begin() as conn:
            await conn.execute(
                update(approval_requests)
                .where(
                    requests.iteration_id == iteration.id,
                    requests.consumer == "mission",
                    requests.status == "pending",
                    requests.expires_at <= func.now(),
                )
                .values(status="expired", decided_at=requests.expires_at)
            )
            approvals = [
                dict(r)
                for r in (
                    await conn.execute(
                        select(
                            requests.id,
                            requests.position,
                            requests.status,
                            requests.tool,
                            requests.arguments_hash,
                            requests.decided_by,
                            requests.decided_at,
                            requests.decision_note,
                        )
                        .where(
                            requests.iteration_id == iteration.id,
                            requests.consumer == "mission",
                            requests.round == iteration.rounds,
                        )
                        .order_by(requests.position)
                    )
                ).mappings()
            ]
            found = await conn.execute(
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
        """Store the run and schedule the next one, and release the lease, in one statement
        (``round_write_statement``, all or nothing): the mission's next run, the iteration
        row, its new tool invocations (journaled ones brought up to date) and its compactions;
        with ``claim``, the worker's next due missions claimed in the same statement
        (``ClaimOrder``: the claim's part sees the database as it was before the statement).

        ``iteration_id=None`` only advances the schedule (the run was skipped). Returns False,
        writing nothing, when this worker no longer owns the lease. Safe to run again after a
        failure that left it unknown whether it committed: a repeat by the same ``attempt``
        of the iteration finds what the first stored and returns True.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused the data (a transient
                failure is ``worker.store.transient.is_transient``).
        """
        params: dict[str, Any] = {
            "p_next_run_at": outcome.next_run_at,
            "p_mission_status": outcome.mission_status,
            "p_last_error": outcome.error,
        }
        if iteration_id is not None:
            params |= {
                "p_status": outcome.status,
                "p_stop_reason": outcome.stop_reason,
                "p_error": outcome.error,
                "p_attempt": attempt,
            }
        row = await self._write(
            "finish",
            mission,
            iteration_id,
            worker_id,
            params,
            checkpoint=_outcome_checkpoint(outcome) if iteration_id is not None else None,
            rows=outcome.tool_invocations,
            end=iteration_id is not None,
            end_parked=iteration_id is None,
            claim=claim,
        )
        return bool(row["owned"]) or bool(row.get("stored"))

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
        """See ``MissionStore.park_iteration``: one statement (``round_write_statement`` with
        the approval request), the lease released, the schedule as it was.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        params: dict[str, Any] = {
            "p_status": "awaiting_approval",
            "p_stop_reason": "awaiting_approval",
            "p_error": None,
            "p_attempt": attempt,
            "p_ttl": request.ttl,
            **{f"p_{key}": getattr(request, key) for key in APPROVAL_KEYS},
        }
        row = await self._write(
            "release",
            mission,
            iteration_id,
            worker_id,
            params,
            checkpoint=checkpoint,
            rows=invocations,
            end=True,
            approval=True,
        )
        if not (row["owned"] or row.get("stored")) or row["approval_id"] is None:
            return None
        return ParkedRun(
            request_id=int(row["approval_id"]),
            created=bool(row["approval_created"]),
            expires_at=row["approval_expires_at"],
        )

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
        in one statement under the lease. Safe to run again.

        With ``reserve`` = ``(limit, consumer, run_anyway)``, the statement first reserves the
        call's rate-limit slot (``mana_ai_reserve_tool_call``, as the ledger does), and stores
        the ``started`` row only when it was taken or ``run_anyway``.

        Raises:
            LeaseLostError: this worker no longer owns the mission (the call must not run).
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        params: dict[str, Any] = {}
        if reserve is not None:
            limit, consumer, run_anyway = reserve
            started = rows[-1]
            params = {
                "p_user_id": mission.owner_user_id,
                "p_tool": started.tool,
                "p_consumer": consumer,
                "p_window": limit.window,
                "p_limit": limit.calls,
                "p_run_anyway": run_anyway,
            }
        written = await self._write(
            "check",
            mission,
            iteration_id,
            worker_id,
            params,
            checkpoint=checkpoint,
            rows=rows,
            reserve=reserve is not None,
        )
        if not written["owned"]:
            raise LeaseLostError(f"mission {mission.id}: lease lost; the call was not run")
        reservation = None
        if reserve is not None:
            reservation = Reservation(
                reserved=bool(written["reserved"]),
                now=written["checked_at"],
                recent=tuple(written["recent"] or ()),
            )
        return CallStart(ids=_new_ids(written), reservation=reservation)

    async def commit_round(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
    ) -> dict[tuple[int, int], int] | None:
        """The round commit: the log, rounds, tokens and reminders so far, the round's
        ``tool_invocations`` rows (new ones inserted, journaled ones brought up to date) and
        the compactions not stored yet, in one statement under the lease — a checkpoint a
        takeover resumes from. Returns the new rows' ids by ``(round, position)``, or ``None``
        (writing nothing) when this worker no longer owns the lease. Safe to run again.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        written = await self._write(
            "check", mission, iteration_id, worker_id, {}, checkpoint=checkpoint, rows=rows
        )
        if not written["owned"]:
            return None
        return _new_ids(written)

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
        """Mark a run ``failed`` / ``interrupted`` and release the lease without advancing
        the schedule, so the next worker takes that scheduled run over and resumes it from
        ``checkpoint`` (the log, rounds, tokens and reminders so far, and the compactions not
        stored yet); ``invocations`` are the calls not yet written (they happened). One
        statement. False when this worker no longer owns the lease (nothing written); a
        repeat by the same ``attempt`` that finds the interruption stored returns True.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed or refused the data.
        """
        params = {
            "p_status": "failed",
            "p_stop_reason": "interrupted",
            "p_error": reason,
            "p_attempt": attempt,
        }
        row = await self._write(
            "release",
            mission,
            iteration_id,
            worker_id,
            params if iteration_id is not None else {},
            checkpoint=checkpoint,
            rows=invocations,
            end=iteration_id is not None,
        )
        return bool(row["owned"]) or bool(row.get("stored"))

    async def _write(
        self,
        mission_write: MissionWrite,
        mission: ClaimedMission,
        iteration_id: int | None,
        worker_id: str,
        params: dict[str, Any],
        *,
        checkpoint: RoundCheckpoint | None,
        rows: Sequence[ToolInvocationRow] = (),
        end: bool = False,
        reserve: bool = False,
        approval: bool = False,
        end_parked: bool = False,
        claim: ClaimOrder | None = None,
    ) -> Mapping[str, Any]:
        """Run the ``round_write_statement`` of this shape; its first row (with ``claim``,
        the missions of its rows are appended to ``claim.claimed``)."""
        # the run's texts (an error, a reason, the model's words) as they can be stored:
        # whatever a peer echoed, a secret never is (``worker.store.rows.json_safe``)
        params = {key: _storable(value) for key, value in params.items()}
        params = {"p_mission_id": mission.id, "p_worker_id": worker_id, **params}
        if claim is not None:
            params |= claim_parameters(
                worker_id=worker_id,
                limit=claim.limit,
                lease=claim.lease,
                default_model=claim.default_model,
                budget_window=claim.budget_window,
            )
        new: list[dict[str, Any]] = []
        known: list[dict[str, Any]] = []
        archive: list[dict[str, Any]] = []
        if iteration_id is not None:
            params["p_iteration_id"] = iteration_id
            for row in rows:
                if row.row_id is None:
                    new.append(_plain(_invocation_values(mission, iteration_id, row)))
                else:
                    known.append(_plain({"id": row.row_id, **invocation_outcome_values(row)}))
            if checkpoint is not None:
                params |= {
                    "p_messages": checkpoint.messages,
                    "p_reminders": encoded_json(checkpoint.reminders),
                    "p_rounds": checkpoint.rounds,
                    "p_prompt_tokens": checkpoint.prompt_tokens,
                    "p_completion_tokens": checkpoint.completion_tokens,
                }
                archive = [_archive_values(mission, iteration_id, r) for r in checkpoint.archive]
            params |= {
                "p_new_calls": encoded_json(new),
                "p_known_calls": encoded_json(known),
                "p_archive": encoded_json(archive),
            }
        stmt = round_write_statement(
            mission_write,
            iteration=iteration_id is not None,
            checkpoint=iteration_id is not None and checkpoint is not None,
            end=end,
            new_calls=bool(new),
            known_calls=bool(known),
            archive=bool(archive),
            reserve=reserve,
            approval=approval,
            end_parked=end_parked,
            claim=claim.limit if claim is not None else 0,
        )
        # a write is conditional on the lease and keyed: run again, it finds itself stored;
        # a claim is not (``claim_due``)
        written = await run_prepared(self.engine, stmt, params, idempotent=claim is None)
        if claim is not None:
            claims = [claimed_mission(r) for r in written if r["id"] is not None]
            claim.claimed.extend(sorted(claims, key=lambda m: m.scheduled_for))
        return written[0]


def _outcome_checkpoint(outcome: IterationOutcome) -> RoundCheckpoint:
    """What a finished run stores on its iteration row, as a checkpoint (with its archive)."""
    return RoundCheckpoint(
        messages=outcome.messages,
        rounds=outcome.rounds,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        reminders=outcome.reminders,
        archive=outcome.archive,
    )


def _new_ids(written: Mapping[str, Any]) -> dict[tuple[int, int], int]:
    """The ids of the calls' rows the statement inserted or found, by ``(round, position)``
    (its ``calls``: ``[[round, position, id], ...]``)."""
    return {(int(r), int(p)): int(i) for r, p, i in written.get("calls") or ()}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``null()`` (SQL NULL in a bind) as ``None``: in a recordset, JSON null is SQL NULL."""
    return {k: None if isinstance(v, Null) else v for k, v in values.items()}


def _archive_values(mission: ClaimedMission, iteration_id: int, row: ArchiveRow) -> dict[str, Any]:
    return {
        "iteration_id": iteration_id,
        "mission_id": mission.id,
        "attempt": row.attempt,
        "compaction_index": row.compaction_index,
        "round": row.round,
        "start_index": row.start_index,
        "folded": row.folded,
        "folded_turns": row.folded_turns,
        "summary": row.summary,
        "tokens_before": row.tokens_before,
        "tokens_after": row.tokens_after,
        "model": row.model,
        "duration_ms": row.duration_ms,
        "error": row.error,
    }


def invocation_outcome_values(row: ToolInvocationRow) -> dict[str, Any]:
    """The outcome columns of a ``tool_invocations`` row (result, error, outcome, policy
    decision and mode, duration), and its ``attempt`` (see ``OUTCOME_KEYS``); a missing
    result or decision is SQL NULL."""
    return {
        "result": null() if row.result is None else row.result,
        "error": row.error,
        "outcome": row.outcome,
        # SQL NULL, not JSON null: "no decision" must read as such in reports
        "policy_decision": null() if row.policy_decision is None else row.policy_decision,
        "policy_mode": row.policy_mode,
        "duration_ms": row.duration_ms,
        "attempt": row.attempt,
    }


def _invocation_values(
    mission: ClaimedMission, iteration_id: int, row: ToolInvocationRow
) -> dict[str, Any]:
    return {
        "iteration_id": iteration_id,
        "mission_id": mission.id,
        "user_id": mission.owner_user_id,
        "attempt": row.attempt,
        "round": row.round,
        "position": row.position,
        "call_id": row.call_id,
        "tool": row.tool,
        "arguments": row.arguments,
        "idempotency_key": row.idempotency_key,
        **invocation_outcome_values(row),
    }


def _storable(value: Any) -> Any:
    """A statement's parameter: text and JSON data through ``json_safe``; anything else (a
    number, a time, an ``EncodedJSON`` made by ``json_safe`` already) as it is."""
    if isinstance(value, str) or type(value) is dict:
        return json_safe(value)
    return value
