"""What the admin commands, the HTTP API and the console read: agents, missions, iterations,
and the approval requests missions wait on, as SQLAlchemy Core statements run on a connection
the caller holds (``AdminStore``, ``mana-ai agents list``, ``missions list|show``,
``iterations list``: the same statements and the same rows for each).

Rows are plain ``dict``s keyed by column name (JSONB decoded by the engine), in the tables'
column order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, func, literal_column, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from worker.db.tables import (
    agent_mcp_servers,
    agents,
    approval_requests,
    mission_iterations,
    tool_invocations,
)
from worker.db.tables import missions as missions_table
from worker.errors import NotFoundError
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "agent_by_name",
    "answers_of",
    "get_mission",
    "list_agents",
    "list_iterations",
    "list_missions",
    "pending_by_mission",
    "with_mcp_servers",
]


async def _all(conn: AsyncConnection, stmt: Select[Any]) -> list[dict[str, Any]]:
    return [dict(row) for row in (await conn.execute(stmt)).mappings()]


async def list_agents(conn: AsyncConnection) -> list[dict[str, Any]]:
    """Every agent, by name: its columns and ``mcp_servers`` (``with_mcp_servers``). Two
    statements, whatever the number of agents."""
    found = await _all(conn, select(agents).order_by(agents.c.name))
    return await with_mcp_servers(conn, found)


async def agent_by_name(conn: AsyncConnection, name: str) -> dict[str, Any] | None:
    """The agent called ``name`` (its columns and ``mcp_servers``), or ``None``."""
    found = await _all(conn, select(agents).where(agents.c.name == name))
    return (await with_mcp_servers(conn, found))[0] if found else None


async def with_mcp_servers(
    conn: AsyncConnection, found: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``found`` (agent rows with an ``id``), each given ``mcp_servers``: its MCP servers by
    name in their public form (``McpServerConfig.public()``: no header or environment
    values). Changes the rows given and returns them; one statement (none for no agents)."""
    servers: dict[int, list[dict[str, Any]]] = {agent["id"]: [] for agent in found}
    if found:
        ams = agent_mcp_servers
        rows = await _all(
            conn,
            select(ams)
            .where(ams.c.agent_id.in_(list(servers)))
            .order_by(ams.c.agent_id, ams.c.name),
        )
        for row in rows:
            servers[row["agent_id"]].append(McpServerConfig.from_row(row).public())
    for agent in found:
        agent["mcp_servers"] = servers[agent["id"]]
    return found


async def list_missions(
    conn: AsyncConnection,
    *,
    status: str | None = None,
    limit: int = 100,
    agent: str | None = None,
    before_id: int | None = None,
    last_run: bool = False,
) -> list[dict[str, Any]]:
    """Missions with their agent's name (``agent``), newest first: of ``status`` and of
    ``agent`` (a name) when given, with ids below ``before_id`` (the next page), ``limit`` at
    most; with ``last_run``, each with its latest iteration's ``last_iteration_id``,
    ``last_status``, ``last_stop_reason`` and ``last_started_at`` (``None`` before any).
    A row's keys: the mission's columns, ``agent``, then those four."""
    m = missions_table
    stmt = select(m, agents.c.name.label("agent")).join(agents, agents.c.id == m.c.agent_id)
    if last_run:
        its = mission_iterations
        latest = (
            select(its.c.id, its.c.status, its.c.stop_reason, its.c.started_at)
            .where(its.c.mission_id == m.c.id)
            .order_by(its.c.id.desc())
            .limit(1)
            .lateral("latest")
        )
        stmt = stmt.add_columns(
            latest.c.id.label("last_iteration_id"),
            latest.c.status.label("last_status"),
            latest.c.stop_reason.label("last_stop_reason"),
            latest.c.started_at.label("last_started_at"),
        ).outerjoin(latest, true())
    if status is not None:
        stmt = stmt.where(m.c.status == status)
    if agent is not None:
        stmt = stmt.where(agents.c.name == agent)
    if before_id is not None:
        stmt = stmt.where(m.c.id < before_id)
    return await _all(conn, stmt.order_by(m.c.id.desc()).limit(limit))


async def get_mission(conn: AsyncConnection, mission_id: int) -> dict[str, Any]:
    """Mission ``mission_id`` with its agent's name (``agent``) and how many iterations it
    has had (``iterations``).

    Raises:
        NotFoundError: no mission has that id.
    """
    m, its = missions_table, mission_iterations
    count = select(func.count()).where(its.c.mission_id == m.c.id).scalar_subquery()
    found = await _all(
        conn,
        select(m, agents.c.name.label("agent"), count.label("iterations"))
        .join(agents, agents.c.id == m.c.agent_id)
        .where(m.c.id == mission_id),
    )
    if not found:
        raise NotFoundError(f"no mission with id {mission_id}")
    return found[0]


async def list_iterations(
    conn: AsyncConnection,
    *,
    mission_id: int | None = None,
    limit: int = 20,
    before_id: int | None = None,
) -> list[dict[str, Any]]:
    """Iterations newest first, without their message logs: of ``mission_id`` when given,
    with ids below ``before_id`` (the next page), ``limit`` at most. A row's keys: the
    iteration's columns but ``messages``."""
    its = mission_iterations
    stmt = select(*(c for c in its.c if c.name != "messages"))
    if mission_id is not None:
        stmt = stmt.where(its.c.mission_id == mission_id)
    if before_id is not None:
        stmt = stmt.where(its.c.id < before_id)
    return await _all(conn, stmt.order_by(its.c.id.desc()).limit(limit))


async def pending_by_mission(conn: AsyncConnection, mission_ids: Sequence[int]) -> dict[int, int]:
    """For the missions among ``mission_ids`` whose run waits for a person's decision: the
    id of the approval request it waits on (the newest pending one not yet expired), by
    mission id. No statement for no ids."""
    if not mission_ids:
        return {}
    requests = approval_requests
    rows = await _all(
        conn,
        select(requests.c.mission_id, func.max(requests.c.id).label("request_id"))
        .where(
            requests.c.mission_id.in_(list(mission_ids)),
            requests.c.status == literal_column("'pending'"),
            requests.c.expires_at > func.now(),
        )
        .group_by(requests.c.mission_id),
    )
    return {int(row["mission_id"]): int(row["request_id"]) for row in rows}


async def answers_of(
    conn: AsyncConnection, iteration_ids: Sequence[int]
) -> dict[int, dict[str, Any]]:
    """What the verdict's warning (``worker.admin.verdict.warning``) is judged from, for those
    of ``iteration_ids`` whose log ends in an answer (an assistant message without calls):
    by id, ``messages`` (the log) and ``tool_invocations`` (each call's ``result`` and
    ``error``). Two statements; none for no ids."""
    if not iteration_ids:
        return {}
    its, calls = mission_iterations, tool_invocations
    last = its.c.messages[-1]
    rows = await _all(
        conn,
        select(its.c.id, its.c.messages).where(
            its.c.id.in_(list(iteration_ids)),
            last["role"].astext == "assistant",
            func.coalesce(func.jsonb_array_length(last["tool_calls"]), 0) == 0,
        ),
    )
    found = {int(r["id"]): {"messages": r["messages"], "tool_invocations": []} for r in rows}
    if found:
        for call in await _all(
            conn,
            select(calls.c.iteration_id, calls.c.result, calls.c.error).where(
                calls.c.iteration_id.in_(list(found))
            ),
        ):
            found[int(call["iteration_id"])]["tool_invocations"].append(call)
    return found
