"""MCP both ways with real processes: ``mana-ai mcp serve`` (streamable HTTP, and ``--stdio``)
as an operator starts it, the SDK's client as in docs/how-to/mcp-serve.md, and a mission whose
agent's MCP server is that very ``mcp serve`` — its call passes the mission's gate and then the MCP
server's, and both are recorded."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import httpx
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import env_for, free_port, run_cli, start_mcp_serve
from tests.fakes import FakeLLMServer, chat_completion_body
from worker.db.tables import notes, tool_invocations
from worker.queries.mcp_tokens import McpStore
from worker.queries.missions import AdminStore
from worker.store.agent_servers import McpServerConfig


def save_a_note_through_mcp(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Round 1: the MCP server's notes_create (namespaced ``self__``); then the answer."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return 200, chat_completion_body(content="Saved it.")
    offered = {t["function"]["name"] for t in body.get("tools", [])}
    if "self__notes_create" not in offered:
        return 200, chat_completion_body(content=f"no MCP tools: {sorted(offered)}")
    return 200, chat_completion_body(tool_calls=[("self__notes_create", {"title": "via mcp"})])


async def rows(db: AsyncEngine, table: Any) -> list[dict[str, Any]]:
    async with db.connect() as conn:
        result = await conn.execute(select(table).order_by(*table.primary_key.columns))
        return [dict(r) for r in result.mappings()]


async def test_both_ways_a_mission_uses_the_tools_of_mana_ais_own_mcp_server(
    db: AsyncEngine, database_url: str
) -> None:
    with FakeLLMServer(save_a_note_through_mcp) as llm:
        env = env_for(
            database_url,
            llm.base_url,
            MANA_AI_POLICY_MODE="enforce",
            MANA_AI_MCP_PORT=str(free_port()),
        )
        _, token = await McpStore(db).create_token("alice")
        serve = await start_mcp_serve(env)
        try:
            # the SDK's client, as docs/how-to/mcp-serve.md shows: list, a refused notes_delete,
            # a bad token
            headers = {"Authorization": f"Bearer {token}"}
            async with (
                httpx2.AsyncClient(headers=headers) as http,
                Client(streamable_http_client(serve.url, http_client=http)) as client,
            ):
                listed = {t.name for t in (await client.list_tools()).tools}
                refused = await client.call_tool("notes_delete", {"id": 1})
            assert {"notes_create", "notes_delete", "clock_now"} <= listed
            assert refused.is_error and "destructive_not_opted_in" in refused.content[0].text
            async with httpx.AsyncClient() as plain:
                bad = await plain.post(serve.url, json={}, headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401

            # the other way: an agent whose MCP server is this mcp serve (made in-process:
            # the command line of `agents add --mcp` has its own tests)
            admin = AdminStore(db)
            agent = await admin.add_agent(
                name="scribe",
                owner_user_id="alice",
                system_prompt="Be brief.",
                mcp_servers=[
                    McpServerConfig(
                        name="self",
                        transport="http",
                        url=serve.url,
                        headers={"Authorization": f"Bearer {token}"},
                        required=True,
                    )
                ],
            )
            await admin.add_mission(
                agent_id=agent["id"],
                objective="Save a note.",
                cron=None,
                timezone="UTC",
                next_run_at=datetime.now(UTC),
            )
            code, _, tick_err = await run_cli(env, "tick", "--once")
            assert code == 0, tick_err
        finally:
            serve_code, serve_err = await serve.stop()
    assert serve_code == 0, serve_err

    [note] = await rows(db, notes)
    assert (note["user_id"], note["title"]) == ("alice", "via mcp")
    by_consumer = {(r["consumer"], r["tool"]): r for r in await rows(db, tool_invocations)}
    mission_call = by_consumer[("mission", "self__notes_create")]
    assert mission_call["outcome"] == "ok" and mission_call["user_id"] == "alice"
    assert mission_call["policy_decision"]["verdict"] == "allow"
    assert mission_call["policy_decision"]["mode"] == "enforce"
    served_call = by_consumer[("mcp", "notes_create")]
    assert served_call["outcome"] == "ok" and served_call["mcp_token_id"] == 1
    assert served_call["policy_decision"]["mode"] == "enforce"
    assert by_consumer[("mcp", "notes_delete")]["outcome"] == "denied"
    assert token not in serve_err + tick_err  # a secret never logged


async def test_stdio_serve_runs_every_call_for_its_user_behind_the_gate(
    db: AsyncEngine, database_url: str
) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "worker.cli", "mcp", "serve", "--stdio", "--user", "bob"],
        env={"MANA_AI_DATABASE_URL": database_url, "MANA_AI_POLICY_MODE": "enforce"},
    )
    async with Client(params) as client:
        created = await client.call_tool("notes_create", {"title": "over stdio"})
        refused = await client.call_tool("notes_delete", {"id": created.structured_content["id"]})
    assert not created.is_error and refused.is_error
    calls = await rows(db, tool_invocations)
    assert [(c["consumer"], c["user_id"], c["tool"], c["outcome"]) for c in calls] == [
        ("mcp", "bob", "notes_create", "ok"),
        ("mcp", "bob", "notes_delete", "denied"),
    ]
    assert all(c["mcp_token_id"] is None for c in calls)
    assert [n["title"] for n in await rows(db, notes)] == ["over stdio"]
