"""Every MCP message mana-ai makes itself is valid under the protocol version its session
negotiated, whichever the SDK speaks (issue 31: a result over the size cap, cut, failed the
agent's call with ``CallToolResult.resultType: Field required`` on a 2026-07-28 session).

Both ways, over real sessions: an agent's MCP server that speaks each version
(``tests.fakes.mcp_raw`` on stdio and over HTTP, and the SDK's own server on stdio, which
negotiates 2026-07-28), whose results over the cap are cut, and whose tool list holds entries
the SDK refuses (taken out alone); and ``mana-ai mcp serve`` answered by clients of each
version: a result, an error result and a refused call's result, each checked against the
version's schema (``mcp_types.methods.validate_server_result``).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from mcp_types.methods import validate_server_result
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ToolContext
from tests.fakes import FakeMcpHttpServer
from tests.fakes.mcp_raw import GOOD_TOOLS, LEFT_OUT, MODERN_VERSIONS
from tests.integration.test_mcp_serve import serving, text_of, token_for
from worker.mcp.session import McpSession
from worker.mcp.sources import McpToolSources
from worker.mcp.translate import McpToolError
from worker.store.agent_servers import McpServerConfig

FAKE = str(Path(__file__).resolve().parents[1] / "fakes" / "mcp_stdio_server.py")
VERSIONS = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)
"""Every protocol version the SDK negotiates, by handshake and by ``server/discover``."""
LIMITS = McpToolSources(max_result_chars=1_000)  # a reply is read up to 71,536 bytes
CUT_NOTE = (
    "\n[cut while it was read: the reply had more than 71536 bytes (6 per character of "
    "MANA_AI_MCP_MAX_RESULT_CHARS + 64 KiB); the first 1000 characters are shown]"
)


def test_the_raw_server_knows_the_versions_the_sdk_negotiates_by_discovery() -> None:
    assert MODERN_VERSIONS == MODERN_PROTOCOL_VERSIONS


@contextlib.asynccontextmanager
async def session(server: McpServerConfig) -> AsyncIterator[McpSession]:
    """A session with ``server`` as a run opens it, closed on exit."""
    opened = McpSession(server, LIMITS)
    try:
        assert await opened.start() is None
        yield opened
    finally:
        await opened.close()


@contextlib.asynccontextmanager
async def raw_server(transport: str, version: str) -> AsyncIterator[McpServerConfig]:
    """``tests.fakes.mcp_raw`` speaking ``version`` over ``transport``."""
    if transport == "stdio":
        args = (FAKE, "--mode", "raw", "--protocol", version)
        yield McpServerConfig(name="raw", transport="stdio", command=sys.executable, args=args)
        return
    with FakeMcpHttpServer(version=version) as http:
        yield McpServerConfig(name="raw", transport="http", url=http.url)


async def call(opened: McpSession, name: str, **arguments: Any) -> Any:
    """Tool ``name`` run as the loop runs it (``McpToolError`` on failure)."""
    specs, _ = opened.tool_specs(set())
    [spec] = [s for s in specs if s.name == f"{opened.server.name}__{name}"]
    return await spec.handler(arguments, ToolContext(user_id="u1"))


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("version", VERSIONS)
async def test_an_agents_server_of_any_version_has_its_results_over_the_cap_cut(
    version: str, transport: str
) -> None:
    async with raw_server(transport, version) as server, session(server) as opened:
        assert opened.client.protocol_version == version == opened.guard.version
        specs, problems = opened.tool_specs(set())
        assert sorted(s.name.removeprefix("raw__") for s in specs) == GOOD_TOOLS
        assert problems == LEFT_OUT  # each taken out alone, as that version's schema says
        assert await call(opened, "huge", size=100_000) == "x" * 1_000 + CUT_NOTE
        with pytest.raises(McpToolError) as failed:
            await call(opened, "huge", size=100_000, is_error=True)
        assert str(failed.value) == "x" * 1_000 + CUT_NOTE
        assert await call(opened, "echo", text="after") == "after"


async def test_the_sdks_own_server_on_2026_07_28_has_its_result_over_the_cap_cut() -> None:
    # the SDK's server writes resultType after the content, and a block's text before its
    # type: the cut's first bytes hold neither
    server = McpServerConfig(name="fs", transport="stdio", command=sys.executable, args=(FAKE,))
    async with session(server) as opened:
        assert opened.client.protocol_version == "2026-07-28"
        assert await call(opened, "big", size=100_000) == "x" * 1_000 + CUT_NOTE
        with pytest.raises(McpToolError, match=r"^the disk is full$"):
            await call(opened, "fails")
        assert await call(opened, "echo", text="after") == "after"


@contextlib.asynccontextmanager
async def sdk_client(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), cache=None, mode=mode) as client,
    ):
        yield client


CALLS = [
    ("notes_create", {"title": "t"}, False, '"title": "t"'),  # a result
    ("nope", {}, True, "unknown tool 'nope'"),  # an error result
    ("notes_delete", {"id": 1}, True, "denied by policy (destructive_not_opted_in)"),  # refused
]


async def test_mcp_serve_answers_clients_of_every_version_in_their_version(
    db: AsyncEngine, database_url: str
) -> None:
    _, token = await token_for(db, "alice")
    async with serving(database_url, policy_mode="enforce") as server:
        for mode, version in (("legacy", HANDSHAKE_PROTOCOL_VERSIONS[-1]), *modern_modes()):
            # the SDK's client checks every result against the version it negotiated
            async with sdk_client(server.url, token, mode) as client:
                assert client.protocol_version == version
                for name, arguments, is_error, said in CALLS:
                    result = await client.call_tool(name, arguments)
                    assert result.is_error is is_error and said in text_of(result), version
        for version in HANDSHAKE_PROTOCOL_VERSIONS:  # a client of that time offers it
            results = await raw_calls(server.url, token, version)
            for (name, _, is_error, said), result in zip(CALLS, results, strict=True):
                validate_server_result("tools/call", version, result)
                assert bool(result.get("isError")) is is_error, (version, name)
                assert said in result["content"][0]["text"], (version, name)


def modern_modes() -> list[tuple[str, str]]:
    return [(version, version) for version in MODERN_PROTOCOL_VERSIONS]


async def raw_calls(url: str, token: str, version: str) -> list[dict[str, Any]]:
    """The results of ``CALLS`` as a client that offers ``version`` in its handshake reads
    them off the wire."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
    }
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:

        async def post(message: dict[str, Any], **extra: str) -> Any:
            answer = await http.post(url, json=message, headers=extra)
            assert answer.status_code < 300, answer.text
            data = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
            return json.loads(data[-1]) if data else None, answer.headers

        client = {"name": "c", "version": "1"}
        hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": client}
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        answered, answer_headers = await post(init)
        assert answered["result"]["protocolVersion"] == version
        session = {"mcp-protocol-version": version}
        if "mcp-session-id" in answer_headers:
            session["mcp-session-id"] = answer_headers["mcp-session-id"]
        await post({"jsonrpc": "2.0", "method": "notifications/initialized"}, **session)
        results = []
        for number, (name, arguments, _, _) in enumerate(CALLS, start=1):
            params = {"name": name, "arguments": arguments}
            request = {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}
            reply, _ = await post(request, **session)
            results.append(reply["result"])
        return results
