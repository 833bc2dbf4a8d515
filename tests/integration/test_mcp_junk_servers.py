"""What an agent's MCP server sends, read as the runner reads it, against a server that sends
what broken servers send (``tests.fakes.mcp_raw``) on every transport mana-ai supports: stdio
(``mcp_stdio_server.py --mode raw``) and streamable HTTP with JSON bodies, SSE, or gzip a
client did not ask for (``FakeMcpHttpServer``).

A 50 MB result is cut while it is read, in memory that does not grow with it; a reply the
SDK cannot parse fails its call at once, with a clear error; junk between replies costs only
itself; a tool the SDK would refuse is left out alone. After each, the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from planner import ToolContext, ToolSpec
from tests.fakes import FakeMcpHttpServer
from tests.fakes.mcp_raw import GOOD_TOOLS, LEFT_OUT
from worker.mcp.sources import McpToolSources
from worker.mcp.translate import McpToolError
from worker.store.agent_servers import McpServerConfig

FAKE = str(Path(__file__).resolve().parents[1] / "fakes" / "mcp_stdio_server.py")
TRANSPORTS = ["stdio", "http", "http-sse", "http-gzip"]
MB = 1_000_000
MIB = 2**20
CUT_NOTE = (
    "\n[cut while it was read: the reply had more than 185536 bytes (6 per character of "
    "MANA_AI_MCP_MAX_RESULT_CHARS + 64 KiB); the first 20000 characters are shown]"
)
UNKNOWN_OUTCOME = (
    "; its outcome is unknown: the write may or may not have taken effect, check before retrying it"
)


@dataclass
class Raw:
    """The raw server's tools as a mission gets them, and how to see what the server did."""

    transport: str
    tools: dict[str, ToolSpec]
    problems: list[str]
    http: FakeMcpHttpServer
    log: Path

    async def call(self, name: str, **arguments: Any) -> Any:
        """Run tool ``name`` of the server as the loop does (``McpToolError`` on failure)."""
        ctx = ToolContext(user_id="u1", idempotency_key="1:1:0")
        return await self.tools[f"raw__{name}"].handler(arguments, ctx)

    def server_finished(self, name: str) -> bool:
        """Whether the server wrote the whole reply of its last call of ``name`` (so far)."""
        if self.transport == "stdio":
            return f"sent {name}\n" in (self.log.read_text() if self.log.exists() else "")
        return self.http.wait_for_call(name).finished


@contextlib.asynccontextmanager
async def raw_server(transport: str, tmp_path: Path, **sources: Any) -> AsyncIterator[Raw]:
    """The raw server over ``transport``, opened by ``McpToolSources(**sources)``."""
    log = tmp_path / "raw.log"
    with FakeMcpHttpServer(sse=transport == "http-sse", gzip=transport == "http-gzip") as http:
        if transport == "stdio":
            server = McpServerConfig(
                name="raw",
                transport="stdio",
                command=sys.executable,
                args=(FAKE, "--mode", "raw", "--log", str(log)),
            )
        else:
            server = McpServerConfig(name="raw", transport="http", url=http.url)
        async with contextlib.AsyncExitStack() as stack:
            opened = await McpToolSources(**sources).open([server], stack)
            tools = {t.name: t for t in opened.tools}
            yield Raw(transport, tools, opened.problems, http, log)


@contextlib.contextmanager
def traced_peak() -> Iterator[list[int]]:
    """``[peak]``: the most memory Python allocated (tracemalloc) inside the block."""
    peak = [0]
    tracemalloc.start()
    try:
        yield peak
        peak[0] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_50_mb_result_sent_at_once_is_cut_while_read_in_bounded_memory(
    transport: str, tmp_path: Path
) -> None:
    async with raw_server(transport, tmp_path) as raw:
        with traced_peak() as peak:
            result = await raw.call("huge", size=50 * MB)
            # on stdio the rest of the line is still coming: the next reply is read after it
            assert await raw.call("echo", text="after") == "after"
        assert result == "x" * 20_000 + CUT_NOTE
        # all 50 MB went by (stdio) or were refused at the socket (HTTP) in a few MiB:
        # holding the reply, as the SDK alone does, takes more than the 50 MB themselves
        assert peak[0] < 10 * MIB
        if transport != "stdio":
            assert not raw.server_finished("huge")  # the client hung up after the limit


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_50_mb_result_trickling_in_is_cut_before_it_has_all_arrived(
    transport: str, tmp_path: Path
) -> None:
    async with raw_server(transport, tmp_path, call_timeout_s=30) as raw:
        started = time.monotonic()
        with traced_peak() as peak:
            # 50 MB over 60 s, its id written last (as the TypeScript SDK writes replies)
            result = await raw.call("huge", size=50 * MB, seconds=60, id_last=True)
        assert result == "x" * 20_000 + CUT_NOTE
        assert not raw.server_finished("huge")
        assert peak[0] < 10 * MIB
        assert time.monotonic() - started < 20  # generous: the server needs 60 s to send it


async def test_a_cut_reply_that_names_its_call_at_its_end_goes_to_that_call(
    tmp_path: Path,
) -> None:
    async with raw_server("stdio", tmp_path) as raw:
        # two calls in flight: which one the cut reply answers is read from its end
        huge, echo = await asyncio.gather(
            raw.call("huge", size=5 * MB, id_last=True), raw.call("echo", text="mine")
        )
    assert huge == "x" * 20_000 + CUT_NOTE
    assert echo == "mine"


GARBLED = {
    "surrogate": "JSON with a lone UTF-16 surrogate (\\ud800), which is not valid Unicode",
    "truncated": "not valid JSON (EOF while parsing a string at line 1 column ",
    "not_jsonrpc": "JSON but not a JSON-RPC message (result: Input should be a valid dictionary)",
    "no_id": "JSON with a lone UTF-16 surrogate (\\ud800), which is not valid Unicode",
}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reply_the_sdk_cannot_read_fails_its_call_at_once_with_the_reason(
    transport: str, tmp_path: Path
) -> None:
    async with raw_server(transport, tmp_path, call_timeout_s=30) as raw:
        for kind, why in GARBLED.items():
            for tool in ("garbled", "garbled_note"):
                started = time.monotonic()
                with pytest.raises(McpToolError) as failed:
                    await raw.call(tool, kind=kind)
                assert time.monotonic() - started < 10  # generous: the call may wait 30 s
                error = str(failed.value)
                assert error.startswith(f"MCP server raw: its reply could not be read: it is {why}")
                if kind == "no_id" and transport == "stdio":  # no POST to tie it to
                    assert ", and names no request; the requests waiting on the session " in error
                # a write whose reply was lost may have taken effect
                assert error.endswith(UNKNOWN_OUTCOME) == (tool == "garbled_note")
        assert await raw.call("echo", text="still here") == "still here"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_junk_between_replies_costs_only_itself(transport: str, tmp_path: Path) -> None:
    async with raw_server(transport, tmp_path, call_timeout_s=30) as raw:
        # a log line on stdout (stdio), an SSE event that is no JSON-RPC (SSE)
        assert await raw.call("chatty") == "chatted"
        assert await raw.call("flood", count=20_000) == "flooded"
        started = time.monotonic()
        if transport == "http-sse":
            # a reply on a POST's stream is that POST's reply, whatever id it names (the SDK)
            assert await raw.call("wrong_id") == "an answer to nobody"
        else:
            with pytest.raises(McpToolError) as failed:
                await raw.call("wrong_id")
            assert str(failed.value) == (
                "MCP server raw: it answered a request it was never sent (id '987654'); the "
                "requests waiting on the session failed, this one among them"
            )
        assert time.monotonic() - started < 10
        assert await raw.call("echo", text="still here") == "still here"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_each_bad_tool_is_left_out_alone_and_the_others_run(
    transport: str, tmp_path: Path
) -> None:
    async with raw_server(transport, tmp_path) as raw:
        assert sorted(raw.tools) == [f"raw__{name}" for name in GOOD_TOOLS]
        assert raw.problems == [f"MCP server raw: {reason}" for reason in LEFT_OUT]
        assert await raw.call("echo", text="hi") == "hi"
        assert await raw.call("note", text="n") == "noted: n"


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        # the tester's: both were "Server returned an error response (MCP error -32603)"
        (401, '{"error": "invalid_token"}', 'HTTP 401 Unauthorized: {"error": "invalid_token"}'),
        (500, "upstream died\n", "HTTP 500 Internal Server Error: upstream died"),
        (503, "", "HTTP 503 Service Unavailable"),
    ],
)
async def test_an_http_servers_error_status_is_said_when_it_cannot_be_listed(
    status: int, body: str, said: str
) -> None:
    with FakeMcpHttpServer(errors={"initialize": (status, body)}) as http:
        server = McpServerConfig(name="web", transport="http", url=http.url)
        async with contextlib.AsyncExitStack() as stack:
            opened = await McpToolSources().open([server], stack)
    [problem] = opened.problems
    assert f"could not connect and list its tools: {said} (MCP error -32603)" in problem


async def test_an_error_status_of_a_call_says_it_and_a_json_rpc_error_in_it(
    tmp_path: Path,
) -> None:
    with FakeMcpHttpServer() as http:
        server = McpServerConfig(name="raw", transport="http", url=http.url)
        async with contextlib.AsyncExitStack() as stack:
            opened = await McpToolSources().open([server], stack)
            echo = {t.name: t for t in opened.tools}["raw__echo"]
            ctx = ToolContext(user_id="u1")
            http.errors["tools/call"] = (502, "<html>Bad Gateway</html>")
            with pytest.raises(McpToolError) as caught:
                await echo.handler({"text": "hi"}, ctx)
            assert str(caught.value) == (
                "MCP server raw: HTTP 502 Bad Gateway: <html>Bad Gateway</html> (MCP error -32603)"
            )
            refused = {"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": "no"}}
            http.errors["tools/call"] = (400, json.dumps(refused))
            with pytest.raises(McpToolError) as caught:
                await echo.handler({"text": "hi"}, ctx)
            assert (
                str(caught.value) == "MCP server raw: HTTP 400 Bad Request: no (MCP error -32602)"
            )
