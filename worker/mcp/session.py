"""One MCP server's client session for ``worker.mcp.sources``: connect, list, call, close.

It holds everything that needs the MCP SDK (about half a second to import), so that a worker
whose agents have no MCP server never loads it: ``McpToolSources.open`` imports this module,
in a thread, the first time an iteration opens a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from pydantic import ValidationError

from planner import ToolContext, ToolSpec
from planner.tools import PolicyHint, ToolHandler
from worker.mcp.config import redact_url
from worker.mcp.guard import SessionGuard
from worker.mcp.translate import McpToolError, result_value, tool_spec
from worker.mcp.wire import MAX_MESSAGE_BYTES, WireLimits, is_lost_reply
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "CLOSE_TIMEOUT_S",
    "CONNECTION_CLOSED",
    "IDEMPOTENCY_META_KEY",
    "MAX_LIST_PAGES",
    "MAX_TOOLS_PER_SERVER",
    "McpSession",
    "SessionLimits",
]

logger = logging.getLogger("worker.mcp.sources")  # the name operators filter the log by

IDEMPOTENCY_META_KEY = "mana-ai/idempotency-key"
"""The ``_meta`` key of a ``tools/call`` request that carries a write or destructive call's
idempotency key (the same for every attempt at that call): a server that applies each key at
most once makes a call a dead worker left in flight safe to retry."""
MAX_TOOLS_PER_SERVER = 128
"""Tools taken from one server at most (OpenAI's limit for a whole request is 128)."""
MAX_LIST_PAGES = 20
"""``tools/list`` pages read at most (a paginator that never ends cannot hang a run)."""
CONNECTION_CLOSED = -32000
"""The SDK's error code for a connection that closed under a request."""
_REPLY_LOST_CODES = frozenset({CONNECTION_CLOSED, -32001, -32700})
"""Error codes of a call whose reply never arrived whole: connection closed, timed out (the
SDK's), parse error (the SDK's, for an HTTP body it could not read)."""
_UNKNOWN_OUTCOME = (
    "its outcome is unknown: the {hint} may or may not have taken effect, check before retrying it"
)
"""What a write's error says when its reply was lost (``planner.execution``'s words for a
write that timed out)."""
CLOSE_TIMEOUT_S = 10.0
"""Seconds closing one session may take at the end of a run (a stdio server gets stdin
closed, then SIGTERM and SIGKILL by the SDK) before its task is cancelled."""


class SessionLimits(Protocol):
    """What a session is told by ``worker.mcp.sources.McpToolSources``: seconds to connect and
    list, seconds one call may wait, characters of one result."""

    list_timeout_s: float
    call_timeout_s: float
    max_result_chars: int


class McpSession:
    """One server's client session, owned by a task of its own (``start``, then
    ``tool_specs``, calls through the specs' handlers, ``close``)."""

    def __init__(self, server: McpServerConfig, sources: SessionLimits) -> None:
        self.server = server
        self.sources = sources
        self.limits = WireLimits.for_result_chars(sources.max_result_chars)
        self.guard = SessionGuard(server.describe())
        self.client: Any = None
        self.listed: list[Any] = []
        self.truncated = False
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str | None:
        """Connect and list; ``None`` when that worked, else the reason (no secrets)."""
        self._task = asyncio.create_task(self._own(), name=f"mcp-{self.server.name}")
        try:
            async with asyncio.timeout(self.sources.list_timeout_s):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close()
            return (
                f"could not connect and list its tools within "
                f"{self.sources.list_timeout_s:g} s (MANA_AI_MCP_LIST_TIMEOUT_S)"
            )
        except Exception as exc:
            await self.close()
            return f"could not connect and list its tools: {self._describe(exc)}"
        return None

    async def _own(self) -> None:
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await self._transport(stack)
                client = await stack.enter_async_context(
                    Client(
                        self.guard.wrap(transport),
                        read_timeout_seconds=self.sources.list_timeout_s,
                        cache=None,
                    )
                )
                self.listed, self.truncated = await _list_tools(client)
                self.client = client
                self._ready.set_result(None)
                await self._closing.wait()
        except BaseException as exc:  # the session is over; a waiting start() learns why
            if not self._ready.done():
                self._ready.set_exception(
                    exc if isinstance(exc, Exception) else ConnectionError("cancelled")
                )
            elif isinstance(exc, Exception):
                logger.warning(
                    "MCP server %s: session ended: %s",
                    self.server.describe(),
                    self._describe(exc),
                )
            self.client = None
            if not isinstance(exc, Exception):  # cancellation (close), or the process exits
                raise

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        import httpx2  # the SDK's HTTP client: the documented way to send headers
        from mcp.client.stdio import StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client

        from worker.mcp.http_transport import BoundedTransport
        from worker.mcp.stdio import bounded_stdio_client

        server, limits = self.server, self.limits
        if server.transport == "http":
            # the SDK's default timeouts (a response stream may stay open), our headers, and
            # a transport that reads each body within the limits
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=dict(server.headers),
                    timeout=httpx2.Timeout(30.0, read=300.0),
                    transport=BoundedTransport(limits, server=server.describe()),
                )
            )
            return streamable_http_client(
                server.url or "",
                http_client=http,
                # ours cuts first; the SDK's own limit must not refuse what ours lets through
                max_sse_event_size=limits.message_bytes + MAX_MESSAGE_BYTES,
            )
        return bounded_stdio_client(
            StdioServerParameters(
                command=server.command or "", args=list(server.args), env=dict(server.env)
            ),
            limits=limits,
            ledger=self.guard.ledger,
            server=server.describe(),
        )

    async def close(self) -> None:
        """End the session (idempotent). Never raises: only a cancellation of the caller
        passes through (``asyncio.wait`` does not raise what the session's task raised)."""
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            if not self._ready.done():
                task.cancel()  # still connecting: nothing to close gracefully
            done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
            if not done:
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
            if not done:
                logger.error("MCP server %s: its session did not end", self.server.describe())
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # retrieved (it was logged, or told to start())
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: start() may have stopped waiting for it

    def tool_specs(self, taken: set[str]) -> tuple[list[ToolSpec], list[str]]:
        """The listed tools as ``ToolSpec``s (names not in ``taken``), and why others were
        left out."""
        specs: list[ToolSpec] = []
        problems = self.guard.listing_problems()
        names = set(taken)
        listed: set[str] = set()
        for tool in self.listed:
            if len(specs) >= MAX_TOOLS_PER_SERVER:
                problems.append(
                    f"it lists more than {MAX_TOOLS_PER_SERVER} tools; the first "
                    f"{MAX_TOOLS_PER_SERVER} were taken"
                )
                break
            spec, problem = tool_spec(self.server, tool, names, self._handler, listed=listed)
            if spec is None:
                problems.append(problem or "a tool was left out")
                continue
            names.add(spec.name)
            listed.add(tool.name)
            specs.append(spec)
        if self.truncated:
            problems.append(
                f"its tool list has more than {MAX_LIST_PAGES} pages; the rest was left out"
            )
        return specs, problems

    def _handler(self, tool_name: str, hint: PolicyHint) -> ToolHandler:
        async def call(arguments: dict[str, Any], ctx: ToolContext) -> Any:
            client = self.client
            if client is None:
                raise McpToolError(f"the session with MCP server {self.server.name} has ended")
            # a write's idempotency key goes along, for a server that can apply it at most once
            meta = {IDEMPOTENCY_META_KEY: ctx.idempotency_key} if ctx.idempotency_key else None
            try:
                result = await client.call_tool(
                    tool_name,
                    arguments,
                    read_timeout_seconds=self.sources.call_timeout_s,
                    meta=meta,
                )
            except Exception as exc:
                text = f"MCP server {self.server.name}: {self._describe(exc)}"
                if hint != "read" and _reply_lost(exc):
                    text += "; " + _UNKNOWN_OUTCOME.format(hint=hint)
                raise McpToolError(text) from None
            return result_value(result, self.sources.max_result_chars)

        return call

    def _describe(self, exc: BaseException) -> str:
        """``exc`` in words, without the server's secrets (its URL's password and query)."""
        from mcp import MCPError

        if isinstance(exc, BaseExceptionGroup):
            leaves = exc.exceptions
            return "; ".join(self._describe(e) for e in leaves[:3])
        if isinstance(exc, MCPError) and is_lost_reply(exc.error.data):
            text = exc.message  # mana-ai's own words (worker.mcp.wire, worker.mcp.guard)
        elif isinstance(exc, MCPError):
            text = f"{exc.message} (MCP error {exc.code})"
            if exc.code == CONNECTION_CLOSED and self.server.transport == "stdio":
                text += "; the server process exited or closed its output (what it wrote to "
                text += "stderr is in the worker's log)"
        elif isinstance(exc, ValidationError):
            where = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3]
            )
            text = f"it answered something that breaks the MCP specification ({where})"
        elif isinstance(exc, FileNotFoundError):
            text = f"its command was not found ({self.server.command})"
        else:  # the model may read it: plain words, the class goes to the log
            logger.info("MCP server %s: %s: %s", self.server.name, type(exc).__name__, exc)
            text = str(exc).strip() or "it failed without saying why"
        url = self.server.url
        if url:
            text = text.replace(url, redact_url(url))
        for value in (*self.server.headers.values(), *self.server.env.values()):
            if len(value) >= 4:
                text = text.replace(value, "***")
        return text[:500]


def _reply_lost(exc: BaseException) -> bool:
    """True when a call failed without its reply read whole (its tool may have run)."""
    from mcp import MCPError

    if isinstance(exc, MCPError):
        return is_lost_reply(exc.error.data) or exc.code in _REPLY_LOST_CODES
    return isinstance(exc, ValidationError)  # a reply, but not a tool result


async def _list_tools(client: Any) -> tuple[list[Any], bool]:
    """Every tool the server lists, page by page (at most ``MAX_LIST_PAGES``), and whether
    pages were left unread."""
    tools: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None or cursor in seen or len(tools) > MAX_TOOLS_PER_SERVER:
            return tools, False
        seen.add(cursor)
    return tools, True
