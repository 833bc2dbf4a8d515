"""Approval requests in PostgreSQL: what people see and decide (``mana-ai approvals``, the
HTTP API), what an MCP client's refused call becomes, and the figures the worker exports.

A request's status is ``pending`` until a person decides (``approved`` or ``denied``) or its
time to live runs out (``expired``: it counts as denied). Reads show a pending request past its
``expires_at`` as ``expired`` at once; it is stored so by the next write that meets it (a
decision refused for it, the takeover that resumes its run, the next request of an MCP client
for the same call). The first decision wins: ``decide`` locks the row, and a second decision,
from any process, is refused with who decided. Nothing is ever deleted.

A decision on a mission's request ``NOTIFY``s the workers (``DUE_CHANNEL``): the parked run is
due at once (the claim skips a mission only while its request is pending and unexpired).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, func, literal_column, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from planner.approvals import ApprovalStatus, arguments_hash
from worker.db.tables import (
    DUE_CHANNEL,
    agents,
    approval_requests,
    mission_iterations,
    missions,
    tool_invocations,
)
from worker.errors import ConflictError, NotFoundError
from worker.queries.approval_status import current_status, lapsed_or_expired
from worker.queries.reads import pending_by_mission
from worker.queries.stored import decided_text
from worker.store.records import ApprovalRequestRow

__all__ = ["ApprovalStore", "arguments_intact", "decided_text"]

Row = dict[str, Any]

_r = approval_requests.c


def _selected() -> Any:
    """Every column of a request (its status as it stands now), its agent's name, and for a
    mission's request its iteration's and mission's status, the mission's objective, and
    what became of the call (the
    latest ``tool_invocations`` row at its round and position: ``call_outcome`` and the
    reason of its decision, ``call_reason``)."""
    calls = tool_invocations.c
    latest = (
        select(calls.outcome, calls.policy_decision["reason"].astext.label("reason"))
        .where(
            calls.iteration_id == _r.iteration_id,
            calls.round == _r.round,
            calls.position == _r.position,
        )
        .order_by(calls.id.desc())
        .limit(1)
        .correlate(approval_requests)
        .lateral("latest_call")
    )
    columns = [c for c in approval_requests.c if c.name != "status"]
    return select(
        *columns,
        current_status(),
        agents.c.name.label("agent"),
        mission_iterations.c.status.label("iteration_status"),
        missions.c.status.label("mission_status"),
        missions.c.objective.label("objective"),
        latest.c.outcome.label("call_outcome"),
        latest.c.reason.label("call_reason"),
    ).select_from(
        approval_requests.outerjoin(agents, agents.c.id == _r.agent_id)
        .outerjoin(mission_iterations, mission_iterations.c.id == _r.iteration_id)
        .outerjoin(missions, missions.c.id == _r.mission_id)
        .outerjoin(latest, literal_column("true"))
    )


def arguments_intact(row: Mapping[str, Any]) -> bool:
    """The request's ``arguments`` still hash to its ``arguments_hash`` (a person reviews the
    arguments; the run checks the hash: they must be the same call)."""
    try:
        return bool(arguments_hash(row["arguments"]) == row["arguments_hash"])
    except (TypeError, ValueError, KeyError):
        return False


def _shown(row: Any) -> Row:
    """A request (a row mapping) as the store gives it: a dict with ``arguments_intact``."""
    shown = dict(row)
    shown["arguments_intact"] = arguments_intact(shown)
    return shown


def _missing(request_id: int) -> str:
    return f"no approval request with id {request_id} (see `mana-ai approvals list`)"


class ApprovalStore:
    """Approval requests over one engine (see the module docstring). Rows are plain dicts with
    the columns of ``approval_requests`` (``status`` as it stands now, ``target`` the tool's
    read-back of what the call acts on), plus ``agent`` (its name), ``iteration_status``,
    ``mission_status``, ``objective`` (the mission's), ``call_outcome`` and ``call_reason``
    (what became of the call: its latest ``tool_invocations`` outcome and decision's reason;
    ``None`` for an MCP client's) and ``arguments_intact`` (the arguments still hash to
    ``arguments_hash``: ``False`` means the row was edited)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def list_requests(
        self, *, status: str | None = None, limit: int = 100, before_id: int | None = None
    ) -> list[Row]:
        """Requests newest first, all or those of ``status`` (as it stands now; ``decided``:
        every one that no longer waits, approved, denied or expired), at most ``limit``, only
        those with an id below ``before_id`` when given (the next page)."""
        stmt = _selected().order_by(_r.id.desc()).limit(limit)
        if before_id is not None:
            stmt = stmt.where(_r.id < before_id)
        if status == "pending":
            stmt = stmt.where(_r.status == "pending", _r.expires_at > func.now())
        elif status == "expired":
            stmt = stmt.where(lapsed_or_expired())
        elif status == "decided":
            stmt = stmt.where(or_(_r.status != "pending", _r.expires_at <= func.now()))
        elif status is not None:
            stmt = stmt.where(_r.status == status)
        async with self.engine.connect() as conn:
            return [_shown(r) for r in (await conn.execute(stmt)).mappings()]

    async def get(self, request_id: int) -> Row:
        """One request. Raises NotFoundError."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(_selected().where(_r.id == request_id))).mappings().first()
        if row is None:
            raise NotFoundError(_missing(request_id))
        return _shown(row)

    async def of_iteration(self, iteration_id: int) -> list[Row]:
        """The requests of one iteration, in the order they were asked."""
        stmt = _selected().where(_r.iteration_id == iteration_id).order_by(_r.id)
        async with self.engine.connect() as conn:
            return [_shown(r) for r in (await conn.execute(stmt)).mappings()]

    async def pending_by_mission(self, mission_ids: list[int]) -> dict[int, int]:
        """For the missions among ``mission_ids`` whose run waits for a decision: the id of
        the request it waits on, by mission id (``worker.queries.reads.pending_by_mission``)."""
        if not mission_ids:
            return {}
        async with self.engine.connect() as conn:
            return await pending_by_mission(conn, mission_ids)

    async def decide(
        self, request_id: int, *, approve: bool, by: str, note: str | None = None
    ) -> Row:
        """Approve or deny request ``request_id`` as ``by``, with ``note`` (the note of an
        approval, the reason of a denial), in one transaction; the request as decided (read
        in the same transaction). A mission's parked run is woken (``NOTIFY``) to go on.

        Raises:
            NotFoundError: no such request.
            ConflictError: it was decided already (the message says by whom and when), it
                expired, its stored arguments no longer match their hash (the row was edited),
                or its run no longer waits for it (the mission or the iteration was deleted,
                the run ended, its deadline passed); an expired request, or one whose run no
                longer waits, is stored as expired. Nothing else is changed.
        """
        async with self.engine.begin() as conn:
            current = await self._locked(conn, request_id)
            refusal = await self._refusal(conn, current)
            if refusal is None:
                await self._decided(conn, current, approve=approve, by=by, note=note)
                decided = (await conn.execute(_selected().where(_r.id == request_id))).mappings()
                return _shown(decided.one())
            status, note_text, message = refusal
            if status is not None:  # stored as it stands (committed as the block ends)
                lapsed = current["lapsed"]
                await conn.execute(
                    update(approval_requests)
                    .where(_r.id == request_id)
                    .values(
                        status=status,
                        decided_at=_r.expires_at if lapsed else func.now(),
                        decision_note=note_text,
                    )
                )
        raise ConflictError(message)

    async def _decided(
        self, conn: AsyncConnection, current: Row, *, approve: bool, by: str, note: str | None
    ) -> None:
        """Store the decision on ``current`` (locked, pending) and wake the workers."""
        await conn.execute(
            update(approval_requests)
            .where(_r.id == current["id"], _r.status == "pending")
            .values(
                status=ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED,
                decided_by=by,
                decided_at=func.now(),
                decision_note=note,
            )
        )
        if current["consumer"] == "mission":
            await conn.execute(select(func.pg_notify(DUE_CHANNEL, "")))

    async def _locked(self, conn: AsyncConnection, request_id: int) -> Row:
        """The request, locked until the transaction ends (a concurrent decision waits, then
        finds it decided), with ``lapsed`` (past its time to live) and ``arguments_intact``
        (its arguments still hash to ``arguments_hash``)."""
        stmt = (
            select(approval_requests, (_r.expires_at <= func.now()).label("lapsed"))
            .where(_r.id == request_id)
            .with_for_update()
        )
        found = (await conn.execute(stmt)).mappings().first()
        if found is None:
            raise NotFoundError(_missing(request_id))
        row = dict(found)
        return row | {"arguments_intact": arguments_intact(row)}

    async def _refusal(
        self, conn: AsyncConnection, current: Row
    ) -> tuple[str | None, str | None, str] | None:
        """Why ``current`` cannot be decided now: ``(status to store or None, its note,
        message)``; ``None`` when it can."""
        request_id = current["id"]
        if current["status"] != "pending":
            done = decided_text(current)
            verb = "" if current["status"] == "expired" else "was "
            return None, None, f"approval request {request_id} {verb}{done}; nothing changed"
        if current["lapsed"]:
            row = current | {"status": "expired", "decided_at": current["expires_at"]}
            lapsed = decided_text(row)
            return "expired", None, f"approval request {request_id} {lapsed}; nothing changed"
        if not current["arguments_intact"]:
            return (
                None,
                None,
                f"approval request {request_id} cannot be decided: its stored arguments no "
                "longer match their hash (the row was edited); nothing changed",
            )
        if current["consumer"] != "mission":
            return None
        found = (
            (
                await conn.execute(
                    select(
                        mission_iterations.c.status,
                        missions.c.id.label("mission"),
                        (missions.c.deadline < func.now()).label("past_deadline"),
                    )
                    .select_from(
                        mission_iterations.outerjoin(
                            missions, missions.c.id == mission_iterations.c.mission_id
                        )
                    )
                    .where(mission_iterations.c.id == current["iteration_id"])
                )
            )
            .mappings()
            .first()
        )
        if found is None or found["mission"] is None:
            note = "its mission was deleted while it waited"
        elif found["status"] != "awaiting_approval":
            note = f"its run no longer waits for it (the iteration is {found['status']})"
        elif found["past_deadline"]:
            note = "its mission's deadline passed while it waited (the run ends without it)"
        else:
            return None
        return (
            "expired",
            note,
            f"approval request {request_id} cannot be decided: {note}; it is now expired",
        )

    async def request_mcp(self, request: ApprovalRequestRow) -> tuple[Row, bool]:
        """The pending request of an MCP client's call (the same user, tool and arguments
        share one: an identical call is never asked about twice while it waits): the one that
        exists, else ``request`` stored (expiring in ``request.ttl``); with whether it was
        created now. A pending request of the same call past its time to live is stored as
        expired first."""
        key = and_(
            _r.consumer == "mcp",
            _r.user_id == request.user_id,
            _r.tool == request.tool,
            _r.arguments_hash == request.arguments_hash,
            _r.status == "pending",
        )
        values = {
            "consumer": "mcp",
            "user_id": request.user_id,
            "call_id": request.call_id,
            "tool": request.tool,
            "arguments": request.arguments,
            "arguments_hash": request.arguments_hash,
            "reason": request.reason,
            "mcp_token_id": request.mcp_token_id,
            "target": request.target,
            "expires_at": func.now() + request.ttl,
        }
        async with self.engine.begin() as conn:
            await conn.execute(
                update(approval_requests)
                .where(key, _r.expires_at <= func.now())
                .values(status="expired", decided_at=_r.expires_at)
            )
            inserted = (
                await conn.execute(
                    pg_insert(approval_requests)
                    .values(values)
                    .on_conflict_do_nothing(
                        index_elements=["user_id", "tool", "arguments_hash"],
                        index_where=text("consumer = 'mcp' AND status = 'pending'"),
                    )
                    .returning(_r.id)
                )
            ).scalar_one_or_none()
            if inserted is None:
                found = (await conn.execute(select(_r.id).where(key))).scalar_one()
        request_id = inserted if inserted is not None else found
        return await self.get(int(request_id)), inserted is not None

    async def mcp_decision(self, user_id: str, tool: str, arguments_hash: str) -> Row | None:
        """The latest decision on an MCP client's call (the same user, tool and arguments)
        that still stands: an approval not used yet, or a denial, within its request's time to
        live (an approval lapses unused at ``expires_at``; a denial is told to the client until
        then, instead of asking again); ``None`` when there is none."""
        stmt = (
            select(approval_requests)
            .where(
                _r.consumer == "mcp",
                _r.user_id == user_id,
                _r.tool == tool,
                _r.arguments_hash == arguments_hash,
                _r.expires_at > func.now(),
                or_(
                    and_(_r.status == "approved", _r.used_at.is_(None)),
                    _r.status == "denied",
                ),
            )
            .order_by(_r.decided_at.desc(), _r.id.desc())
            .limit(1)
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return dict(row) if row is not None else None

    async def use(self, request_id: int) -> bool:
        """Mark approved request ``request_id`` used (its call runs now); False when it was
        used already (another call of the client took it first: an approval allows one call)
        or lapsed unused."""
        stmt = (
            update(approval_requests)
            .where(
                _r.id == request_id,
                _r.status == "approved",
                _r.used_at.is_(None),
                _r.expires_at > func.now(),
            )
            .values(used_at=func.now())
            .returning(_r.id)
        )
        async with self.engine.begin() as conn:
            return (await conn.execute(stmt)).first() is not None

    async def stats(self) -> tuple[dict[str, int], int, float]:
        """``(decided by decision, pending, age in seconds of the oldest pending)`` as they
        stand now (``worker.metrics.ApprovalStats``), in one statement."""
        now = func.now()
        live = and_(_r.status == "pending", _r.expires_at > now)
        stmt = select(
            func.count().filter(_r.status == "approved"),
            func.count().filter(_r.status == "denied"),
            func.count().filter(lapsed_or_expired()),
            func.count().filter(live),
            func.coalesce(func.extract("epoch", now - func.min(_r.created_at).filter(live)), 0),
        ).select_from(approval_requests)
        async with self.engine.connect() as conn:
            approved, denied, expired, pending, oldest = (await conn.execute(stmt)).one()
        decided = {"approved": int(approved), "denied": int(denied), "expired": int(expired)}
        return decided, int(pending), float(oldest)
