"""Queries behind the admin commands: agents, missions, iterations (``mana-ai …``).

Every method validates what it writes before writing anything, so a bad ``missions add``
leaves the database untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from sqlalchemy import Executable, delete, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker.db.tables import (
    agent_mcp_servers,
    agents,
    approval_requests,
    compacted_turns,
    mission_iterations,
    missions,
    tool_invocations,
)
from worker.errors import ConflictError, NotFoundError
from worker.queries.approval_status import current_status
from worker.queries.reads import (
    agent_by_name,
    answers_of,
    get_mission,
    list_agents,
    list_iterations,
    list_missions,
    with_mcp_servers,
)
from worker.queries.stored import StoredIteration
from worker.store.agent_servers import McpServerConfig

__all__ = ["AdminStore"]

Row = dict[str, Any]

SOURCE_ORDER = (
    tool_invocations.c.attempt,
    tool_invocations.c.round,
    tool_invocations.c.position,
    tool_invocations.c.id,
)
"""An iteration's calls as the model wrote them: attempt by attempt, round by round, in each
round in the order of the assistant message (never by row id: concurrent reads finish, and
may be stored, in any order)."""


class AdminStore:
    """Admin reads and writes over one AsyncEngine. Returns plain dicts (JSON-ready after
    ``isoformat`` of datetimes). An agent's row carries ``mcp_servers``: its MCP servers in
    their public form (``McpServerConfig.public()``: no header or environment values), so no
    secret leaves this store for the command line."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # agents -------------------------------------------------------------------------------

    async def add_agent(
        self,
        *,
        name: str,
        owner_user_id: str,
        system_prompt: str,
        model: str | None = None,
        max_rounds: int = 5,
        max_tokens_per_day: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        policy_mode: str | None = None,
        compact_max_ctx: int | None = None,
        mcp_servers: Sequence[McpServerConfig] = (),
        destructive_policy: str | None = None,
    ) -> Row:
        """Create an agent with its MCP servers (one transaction). Raises ConflictError when
        ``name`` is taken."""
        stmt = (
            insert(agents)
            .values(
                name=name,
                owner_user_id=owner_user_id,
                system_prompt=system_prompt,
                model=model,
                max_rounds=max_rounds,
                max_tokens_per_day=max_tokens_per_day,
                allowed_tools=list(allowed_tools) if allowed_tools is not None else None,
                policy_mode=policy_mode,
                compact_max_ctx=compact_max_ctx,
                destructive_policy=destructive_policy,
            )
            .returning(*agents.c)
        )
        try:
            async with self.engine.begin() as conn:
                row = dict((await conn.execute(stmt)).mappings().one())
                await _put_mcp_servers(conn, row["id"], mcp_servers)
                return await _with_mcp_servers(conn, row)
        except IntegrityError as exc:
            raise ConflictError(f"an agent named {name!r} already exists") from exc

    async def update_agent(
        self,
        name: str,
        *,
        mcp_servers: Sequence[McpServerConfig] = (),
        remove_mcp: Sequence[str] = (),
        **changes: Any,
    ) -> Row:
        """Change the columns in ``changes`` of the agent called ``name`` (validated by the
        caller; ``allowed_tools`` may be ``None`` for every tool), add or replace the MCP
        servers ``mcp_servers`` (by name) and remove those named in ``remove_mcp``, in one
        transaction.

        Raises:
            NotFoundError: no such agent, or ``remove_mcp`` names a server it does not have
                (nothing is changed then).
        """
        if "allowed_tools" in changes and changes["allowed_tools"] is not None:
            changes["allowed_tools"] = list(changes["allowed_tools"])
        query: Executable
        if changes:
            query = (
                update(agents).where(agents.c.name == name).values(**changes).returning(*agents.c)
            )
        else:  # MCP servers only: lock the agent row as the update would
            query = select(agents).where(agents.c.name == name).with_for_update()
        async with self.engine.begin() as conn:
            found = (await conn.execute(query)).mappings().first()
            if found is None:
                raise NotFoundError(f"no agent named {name!r} (see `mana-ai agents list`)")
            agent = dict(found)
            if remove_mcp:
                removed = await conn.execute(
                    delete(agent_mcp_servers)
                    .where(
                        agent_mcp_servers.c.agent_id == agent["id"],
                        agent_mcp_servers.c.name.in_(list(remove_mcp)),
                    )
                    .returning(agent_mcp_servers.c.name)
                )
                missing = sorted(set(remove_mcp) - set(removed.scalars().all()))
                if missing:
                    await conn.rollback()
                    raise NotFoundError(
                        f"agent {name} has no MCP server named {', '.join(missing)}; nothing "
                        "was changed"
                    )
            await _put_mcp_servers(conn, agent["id"], mcp_servers)
            return await _with_mcp_servers(conn, agent)

    async def list_agents(self) -> list[Row]:
        """Every agent, by name (``worker.queries.reads.list_agents``)."""
        async with self.engine.connect() as conn:
            return await list_agents(conn)

    async def agent_by_name(self, name: str) -> Row:
        """The agent called ``name`` (``worker.queries.reads.agent_by_name``). Raises
        NotFoundError."""
        async with self.engine.connect() as conn:
            found = await agent_by_name(conn, name)
        if found is None:
            raise NotFoundError(f"no agent named {name!r} (see `mana-ai agents list`)")
        return found

    # missions -----------------------------------------------------------------------------

    async def database_now(self) -> datetime:
        """The database's clock (``now()``, UTC-aware): the one the claim judges what is due
        by, so that what an admin schedules does not depend on this client's clock."""
        async with self.engine.connect() as conn:
            now: datetime = (await conn.execute(select(func.now()))).scalar_one()
        return now

    async def add_mission(
        self,
        *,
        agent_id: int,
        objective: str,
        cron: str | None,
        timezone: str,
        next_run_at: datetime | Literal["now"],
        deadline: datetime | None = None,
        catch_up: str = "once",
        catch_up_window: timedelta | None = None,
    ) -> Row:
        """Create an active mission due at ``next_run_at`` (validated by the caller).

        ``"now"`` is the database's clock, the one the claim compares with: a mission due now
        is claimable (and wakes the listening workers, migration 0007) even when this client's
        clock runs ahead of the server's.
        """
        stmt = (
            insert(missions)
            .values(
                agent_id=agent_id,
                objective=objective,
                cron=cron,
                timezone=timezone,
                next_run_at=func.now() if next_run_at == "now" else next_run_at,
                deadline=deadline,
                catch_up=catch_up,
                catch_up_window=catch_up_window,
            )
            .returning(*missions.c)
        )
        async with self.engine.begin() as conn:
            return dict((await conn.execute(stmt)).mappings().one())

    async def list_missions(
        self,
        *,
        status: str | None = None,
        limit: int = 100,
        agent: str | None = None,
        before_id: int | None = None,
        last_run: bool = False,
    ) -> list[Row]:
        """Missions with their agent's name, newest first (``worker.queries.reads.list_missions``,
        which says what the arguments select)."""
        async with self.engine.connect() as conn:
            return await list_missions(
                conn,
                status=status,
                limit=limit,
                agent=agent,
                before_id=before_id,
                last_run=last_run,
            )

    async def get_mission(self, mission_id: int) -> Row:
        """One mission with its agent's name and iteration count
        (``worker.queries.reads.get_mission``). Raises NotFoundError."""
        async with self.engine.connect() as conn:
            return await get_mission(conn, mission_id)

    async def pause_mission(self, mission_id: int) -> Row:
        """Pause a mission (idempotent); a running iteration still finishes.

        Raises NotFoundError; ConflictError for a completed mission.
        """
        row = await self._set_status(mission_id, "paused", {"active", "paused"}, {})
        if row is None:
            raise await self._status_conflict(mission_id, "paused")
        return row

    async def resume_mission(self, mission_id: int, *, next_run_at: datetime | None) -> Row:
        """Resume a *paused* mission; ``next_run_at`` (when given) replaces its next run.

        Returns the mission unchanged when it is already active. Raises NotFoundError;
        ConflictError for a completed mission.
        """
        values = {} if next_run_at is None else {"next_run_at": next_run_at}
        row = await self._set_status(mission_id, "active", {"paused"}, values)
        if row is None:
            current = await self.get_mission(mission_id)
            if current["status"] == "active":
                return current
            raise await self._status_conflict(mission_id, "resumed")
        return row

    async def run_now(self, mission_id: int) -> Row | None:
        """Make active mission ``mission_id`` due now (the database's clock: listening
        workers are woken, migration 0007) unless a worker holds its lease; the mission, or
        ``None`` when it was not active or is leased."""
        stmt = (
            update(missions)
            .where(
                missions.c.id == mission_id,
                missions.c.status == "active",
                or_(
                    missions.c.lease_expires_at.is_(None), missions.c.lease_expires_at < func.now()
                ),
            )
            .values(next_run_at=func.now(), updated_at=func.now())
            .returning(*missions.c)
        )
        async with self.engine.begin() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return dict(row) if row is not None else None

    async def parked_iteration(self, mission_id: int) -> Row | None:
        """The mission's run parked for an approval (``id``, ``scheduled_for``), or ``None``:
        resuming the mission must keep that run's scheduled time, or the run is left behind."""
        its = mission_iterations.c
        stmt = (
            select(its.id, its.scheduled_for)
            .where(its.mission_id == mission_id, its.status == "awaiting_approval")
            .order_by(its.id.desc())
            .limit(1)
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return dict(row) if row is not None else None

    async def _set_status(
        self, mission_id: int, status: str, from_statuses: set[str], values: dict[str, Any]
    ) -> Row | None:
        stmt = (
            update(missions)
            .where(missions.c.id == mission_id, missions.c.status.in_(sorted(from_statuses)))
            .values(status=status, updated_at=func.now(), **values)
            .returning(*missions.c)
        )
        async with self.engine.begin() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return dict(row) if row is not None else None

    async def _status_conflict(self, mission_id: int, verb: str) -> ConflictError:
        await self.get_mission(mission_id)  # NotFoundError when it does not exist
        return ConflictError(
            f"mission {mission_id} is completed and cannot be {verb}; add a new mission instead"
        )

    # iterations ---------------------------------------------------------------------------

    async def list_iterations(
        self, *, mission_id: int | None = None, limit: int = 20, before_id: int | None = None
    ) -> list[Row]:
        """Iterations newest first, without their message logs
        (``worker.queries.reads.list_iterations``, which says what the arguments select)."""
        async with self.engine.connect() as conn:
            return await list_iterations(
                conn, mission_id=mission_id, limit=limit, before_id=before_id
            )

    async def answers_of(self, iteration_ids: Sequence[int]) -> dict[int, Row]:
        """What the verdict's warning is judged from, by iteration id
        (``worker.queries.reads.answers_of``)."""
        if not iteration_ids:
            return {}
        async with self.engine.connect() as conn:
            return await answers_of(conn, iteration_ids)

    async def iteration_id_or_latest(self, iteration_id: int | None) -> int:
        """``iteration_id``, or with ``None`` the id of the latest iteration (the CLI's
        ``latest``). Raises NotFoundError when there is none yet."""
        if iteration_id is not None:
            return iteration_id
        latest = await self.list_iterations(limit=1)
        if not latest:
            raise NotFoundError("no iterations stored yet (run `mana-ai tick --once`)")
        return int(latest[0]["id"])

    async def get_iteration(self, iteration_id: int) -> StoredIteration:
        """One iteration with its message log, ``tool_invocations`` (list of dicts, in
        execution order), ``compactions`` (its ``compacted_turns`` rows, the folded messages
        included, in the order they happened) and ``approvals`` (its ``approval_requests``
        rows, status as it stands now). Raises NotFoundError."""
        async with self.engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(mission_iterations).where(mission_iterations.c.id == iteration_id)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                raise NotFoundError(f"no iteration with id {iteration_id}")
            calls = await conn.execute(
                select(tool_invocations)
                .where(tool_invocations.c.iteration_id == iteration_id)
                .order_by(*SOURCE_ORDER)
            )
            archive = await conn.execute(
                select(compacted_turns)
                .where(compacted_turns.c.iteration_id == iteration_id)
                .order_by(compacted_turns.c.compaction_index)
            )
            requests = await conn.execute(
                select(
                    *(c for c in approval_requests.c if c.name != "status"),
                    current_status(),
                )
                .where(approval_requests.c.iteration_id == iteration_id)
                .order_by(approval_requests.c.id)
            )
            stored = dict(row) | {
                "tool_invocations": [dict(c) for c in calls.mappings()],
                "compactions": [dict(c) for c in archive.mappings()],
                "approvals": [dict(r) for r in requests.mappings()],
            }
            return cast(StoredIteration, stored)

    async def mission_history(self, mission_id: int, *, limit: int = 20) -> Row:
        """The mission (as ``get_mission``, its iteration count as ``iteration_count``) with
        ``iterations``: its latest ``limit`` iterations, newest first, without their logs,
        each with ``compactions``: its ``compacted_turns`` rows without the folded messages,
        in order. Raises NotFoundError."""
        mission = await self.get_mission(mission_id)
        iterations = await self.list_iterations(mission_id=mission_id, limit=limit)
        by_id: dict[int, list[Row]] = {it["id"]: [] for it in iterations}
        if by_id:
            cols = [c for c in compacted_turns.c if c.name != "folded"]
            stmt = (
                select(*cols)
                .where(compacted_turns.c.iteration_id.in_(list(by_id)))
                .order_by(compacted_turns.c.iteration_id, compacted_turns.c.compaction_index)
            )
            async with self.engine.connect() as conn:
                for row in (await conn.execute(stmt)).mappings():
                    by_id[row["iteration_id"]].append(dict(row))
        for it in iterations:
            it["compactions"] = by_id[it["id"]]
        return mission | {"iteration_count": mission["iterations"], "iterations": iterations}


async def _put_mcp_servers(
    conn: AsyncConnection, agent_id: int, servers: Sequence[McpServerConfig]
) -> None:
    """Add or replace (by name) the agent's MCP servers ``servers``."""
    if not servers:
        return
    stmt = pg_insert(agent_mcp_servers).values(
        [{"agent_id": agent_id, **server.row()} for server in servers]
    )
    columns = ("transport", "url", "command", "args", "headers", "env", "required")
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["agent_id", "name"],
            set_={column: stmt.excluded[column] for column in columns},
        )
    )


async def _with_mcp_servers(conn: AsyncConnection, agent: Row) -> Row:
    """``agent`` with ``mcp_servers`` (``worker.queries.reads.with_mcp_servers``), read in
    ``conn``'s transaction."""
    [shown] = await with_mcp_servers(conn, [agent])
    return shown
