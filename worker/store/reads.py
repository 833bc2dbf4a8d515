"""Reads of the admin commands as SQL text over a ``Fetch``: the same statements and the same
rows whether they run on the engine's pooled connection (``worker.store.engine.engine_fetch``,
what ``AdminStore`` and the HTTP API use) or on one asyncpg connection of a command's own
(``worker.store.direct.read_directly``, what ``mana-ai agents list``, ``missions list``,
``missions show`` and ``iterations list`` use, without loading SQLAlchemy).

The statements name their columns (``tests/unit/test_reads.py`` holds them to
``worker.store.tables``) and read JSONB as text, decoded here, so that rows do not depend on
the codecs a connection has. PostgreSQL's ``$1`` parameters.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

from worker.errors import NotFoundError
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "AGENT_COLUMNS",
    "ITERATION_COLUMNS",
    "MCP_SERVER_COLUMNS",
    "MISSION_COLUMNS",
    "Fetch",
    "Rows",
    "agent_by_name",
    "get_mission",
    "list_agents",
    "list_iterations",
    "list_missions",
    "pending_by_mission",
    "with_mcp_servers",
]

Rows = Sequence[Mapping[str, Any]]
"""A statement's rows, each read by column name."""


class Fetch(Protocol):
    """Run one statement (SQL text with ``$1``… parameters) and return its rows."""

    def __call__(self, sql: str, *arguments: Any) -> Awaitable[Rows]: ...


AGENT_COLUMNS = (
    "id",
    "name",
    "owner_user_id",
    "model",
    "system_prompt",
    "max_rounds",
    "max_tokens_per_day",
    "allowed_tools",
    "created_at",
    "policy_mode",
    "compact_max_ctx",
    "destructive_policy",
)
"""The columns of ``agents``, in the table's order: an agent row's keys, in that order."""

MCP_SERVER_COLUMNS = (
    "agent_id",
    "name",
    "transport",
    "url",
    "command",
    "args",
    "headers",
    "env",
    "required",
    "created_at",
)
"""The columns of ``agent_mcp_servers``, in the table's order (read: all but ``created_at``;
``headers`` and ``env``, JSONB, as text)."""

MISSION_COLUMNS = (
    "id",
    "agent_id",
    "objective",
    "cron",
    "timezone",
    "status",
    "next_run_at",
    "lease_owner",
    "lease_expires_at",
    "deadline",
    "last_error",
    "created_at",
    "updated_at",
    "catch_up",
    "catch_up_window",
)
"""The columns of ``missions``, in the table's order."""

_MISSION = ", ".join(f"missions.{column}" for column in MISSION_COLUMNS)

ITERATION_COLUMNS = (
    "id",
    "mission_id",
    "scheduled_for",
    "status",
    "attempt",
    "messages",
    "reminders",
    "attempts",
    "rounds",
    "prompt_tokens",
    "completion_tokens",
    "stop_reason",
    "error",
    "worker_id",
    "model",
    "started_at",
    "finished_at",
)
"""The columns of ``mission_iterations``, in the table's order."""

_JSON_ITERATION_COLUMNS = frozenset({"messages", "reminders", "attempts"})
"""Its JSONB columns (none of them nullable)."""

_AGENT = f"SELECT {', '.join(AGENT_COLUMNS)} FROM agents"
_SERVERS_OF = (
    "SELECT "
    + ", ".join(
        f"{column}::text AS {column}" if column in ("headers", "env") else column
        for column in MCP_SERVER_COLUMNS
        if column != "created_at"
    )
    + " FROM agent_mcp_servers WHERE agent_id = ANY($1::bigint[]) ORDER BY agent_id, name"
)


async def list_agents(fetch: Fetch) -> list[dict[str, Any]]:
    """Every agent, by name: its columns (``AGENT_COLUMNS``) and ``mcp_servers``
    (``with_mcp_servers``). Two statements, whatever the number of agents."""
    agents = [dict(row) for row in await fetch(f"{_AGENT} ORDER BY name")]
    return await with_mcp_servers(fetch, agents)


async def agent_by_name(fetch: Fetch, name: str) -> dict[str, Any] | None:
    """The agent called ``name`` (its columns and ``mcp_servers``), or ``None``."""
    rows = await fetch(f"{_AGENT} WHERE name = $1", name)
    return (await with_mcp_servers(fetch, [dict(rows[0])]))[0] if rows else None


async def with_mcp_servers(fetch: Fetch, agents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``agents`` (rows with an ``id``), each given ``mcp_servers``: its MCP servers by name
    in their public form (``McpServerConfig.public()``: no header or environment values).
    Changes the rows given and returns them; one statement (none for no agents)."""
    servers: dict[int, list[dict[str, Any]]] = {agent["id"]: [] for agent in agents}
    if agents:
        for row in await fetch(_SERVERS_OF, list(servers)):
            server = {**row, "headers": json.loads(row["headers"]), "env": json.loads(row["env"])}
            servers[row["agent_id"]].append(McpServerConfig.from_row(server).public())
    for agent in agents:
        agent["mcp_servers"] = servers[agent["id"]]
    return agents


_LATEST_RUN = (
    ", latest.id AS last_iteration_id, latest.status AS last_status, "
    "latest.stop_reason AS last_stop_reason, latest.started_at AS last_started_at"
)
_LATEST_RUN_JOIN = (
    " LEFT OUTER JOIN LATERAL (SELECT id, status, stop_reason, started_at "
    "FROM mission_iterations WHERE mission_iterations.mission_id = missions.id "
    "ORDER BY id DESC LIMIT 1) AS latest ON true"
)


async def list_missions(
    fetch: Fetch,
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
    A row's keys: ``MISSION_COLUMNS``, ``agent``, then those four."""
    where, arguments = _where(
        ("missions.status = ", status), ("agents.name = ", agent), ("missions.id < ", before_id)
    )
    sql = (
        f"SELECT {_MISSION}, agents.name AS agent"
        + (_LATEST_RUN if last_run else "")
        + " FROM missions JOIN agents ON agents.id = missions.agent_id"
        + (_LATEST_RUN_JOIN if last_run else "")
        + f"{where} ORDER BY missions.id DESC LIMIT ${len(arguments) + 1}"
    )
    return [dict(row) for row in await fetch(sql, *arguments, limit)]


_GET_MISSION = (
    f"SELECT {_MISSION}, agents.name AS agent, (SELECT count(*) FROM mission_iterations "
    "WHERE mission_iterations.mission_id = missions.id) AS iterations "
    "FROM missions JOIN agents ON agents.id = missions.agent_id WHERE missions.id = $1"
)


async def get_mission(fetch: Fetch, mission_id: int) -> dict[str, Any]:
    """Mission ``mission_id`` with its agent's name (``agent``) and how many iterations it
    has had (``iterations``).

    Raises:
        NotFoundError: no mission has that id.
    """
    rows = await fetch(_GET_MISSION, mission_id)
    if not rows:
        raise NotFoundError(f"no mission with id {mission_id}")
    return dict(rows[0])


_ITERATION_LISTED = ", ".join(
    f"{column}::text AS {column}" if column in _JSON_ITERATION_COLUMNS else column
    for column in ITERATION_COLUMNS
    if column != "messages"
)


async def list_iterations(
    fetch: Fetch, *, mission_id: int | None = None, limit: int = 20, before_id: int | None = None
) -> list[dict[str, Any]]:
    """Iterations newest first, without their message logs: of ``mission_id`` when given,
    with ids below ``before_id`` (the next page), ``limit`` at most. A row's keys:
    ``ITERATION_COLUMNS`` but ``messages``; ``reminders`` and ``attempts`` decoded."""
    where, arguments = _where(("mission_id = ", mission_id), ("id < ", before_id))
    sql = (
        f"SELECT {_ITERATION_LISTED} FROM mission_iterations{where} "
        f"ORDER BY id DESC LIMIT ${len(arguments) + 1}"
    )
    return [
        {
            key: json.loads(value) if key in _JSON_ITERATION_COLUMNS else value
            for key, value in row.items()
        }
        for row in await fetch(sql, *arguments, limit)
    ]


def _where(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """`` WHERE a = $1 AND b < $2`` of the conditions whose value is not ``None`` (each
    ``(text before the parameter, value)``), and their values in order; ``("", [])`` when
    none is."""
    given = [(text, value) for text, value in conditions if value is not None]
    if not given:
        return "", []
    clauses = [f"{text}${n}" for n, (text, _) in enumerate(given, start=1)]
    return " WHERE " + " AND ".join(clauses), [value for _, value in given]


_PENDING_BY_MISSION = (
    "SELECT mission_id, max(id) AS request_id FROM approval_requests "
    "WHERE mission_id = ANY($1::bigint[]) AND status = 'pending' AND expires_at > now() "
    "GROUP BY mission_id"
)


async def pending_by_mission(fetch: Fetch, mission_ids: Sequence[int]) -> dict[int, int]:
    """For the missions among ``mission_ids`` whose run waits for a person's decision: the
    id of the approval request it waits on (the newest pending one not yet expired), by
    mission id. No statement for no ids."""
    if not mission_ids:
        return {}
    rows = await fetch(_PENDING_BY_MISSION, list(mission_ids))
    return {int(row["mission_id"]): int(row["request_id"]) for row in rows}
