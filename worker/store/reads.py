"""Reads of the admin commands as SQL text over a ``Fetch``: the same statements and the same
rows whether they run on the engine's pooled connection (``worker.store.engine.engine_fetch``,
what ``AdminStore`` and the HTTP API use) or on one asyncpg connection of a command's own
(``worker.store.direct.read_directly``, what ``mana-ai agents list`` uses, without loading
SQLAlchemy).

The statements name their columns (``tests/unit/test_reads.py`` holds them to
``worker.store.tables``) and read JSONB as text, decoded here, so that rows do not depend on
the codecs a connection has. PostgreSQL's ``$1`` parameters.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

from worker.store.agent_servers import McpServerConfig

__all__ = ["AGENT_COLUMNS", "MCP_SERVER_COLUMNS", "Fetch", "Rows", "list_agents"]

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
"""The columns of ``agent_mcp_servers``, in the table's order."""

_LIST_AGENTS = f"SELECT {', '.join(AGENT_COLUMNS)} FROM agents ORDER BY name"
_SERVERS_OF = (
    "SELECT agent_id, name, transport, url, command, args, headers::text AS headers, "
    "env::text AS env, required FROM agent_mcp_servers "
    "WHERE agent_id = ANY($1::bigint[]) ORDER BY agent_id, name"
)


async def list_agents(fetch: Fetch) -> list[dict[str, Any]]:
    """Every agent, by name: its columns (``AGENT_COLUMNS``) and ``mcp_servers``, its MCP
    servers by name in their public form (``McpServerConfig.public()``: no header or
    environment values). Two statements, whatever the number of agents."""
    agents = [dict(row) for row in await fetch(_LIST_AGENTS)]
    servers: dict[int, list[dict[str, Any]]] = {agent["id"]: [] for agent in agents}
    if agents:
        for row in await fetch(_SERVERS_OF, list(servers)):
            server = {**row, "headers": json.loads(row["headers"]), "env": json.loads(row["env"])}
            servers[row["agent_id"]].append(McpServerConfig.from_row(server).public())
    for agent in agents:
        agent["mcp_servers"] = servers[agent["id"]]
    return agents
