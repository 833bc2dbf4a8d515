"""The statements of ``worker.store.reads`` name the tables' columns, in the tables' order
(``worker.store.tables`` is where the schema is written down)."""

from __future__ import annotations

from worker.store.reads import (
    AGENT_COLUMNS,
    ITERATION_COLUMNS,
    MCP_SERVER_COLUMNS,
    MISSION_COLUMNS,
)
from worker.store.tables import agent_mcp_servers, agents, mission_iterations, missions


def test_the_reads_name_the_tables_columns_in_order() -> None:
    assert AGENT_COLUMNS == tuple(c.name for c in agents.c)
    assert MCP_SERVER_COLUMNS == tuple(c.name for c in agent_mcp_servers.c)
    assert MISSION_COLUMNS == tuple(c.name for c in missions.c)
    assert ITERATION_COLUMNS == tuple(c.name for c in mission_iterations.c)
