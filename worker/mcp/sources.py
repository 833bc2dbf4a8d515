"""MCP servers as tool sources of a mission: list their tools at the start of an iteration and
offer them to the agent as ``ToolSpec``s like the built-in ones.

For each server of the agent (``McpServerConfig``), ``McpToolSources.open`` starts an MCP
client session (the official SDK's ``Client``: streamable HTTP, or a stdio process), lists its
tools within ``list_timeout_s`` (connecting included), and turns each tool into a ``ToolSpec``
(``worker.mcp.translate``: ``SERVER__tool`` in scope ``mcp:SERVER``, its policy hint from its
annotations, its schema when usable) whose handler calls the tool on the session.

What the server sends is read within ``worker.mcp.wire``'s limits while it comes in (stdio:
``worker.mcp.stdio``; HTTP: ``worker.mcp.http_transport`` under the SDK's client), and
``worker.mcp.guard`` sits between the transport and the SDK: a reply the SDK would drop fails
its call at once, and a tool whose listing entry the SDK would refuse is left out alone. A
call whose reply was lost that way (or whose session closed under it) is, for a write, said
to have an unknown outcome, as a write that timed out is.

The sessions live until the iteration ends (the caller's ``AsyncExitStack``). Each runs in a
task of its own, so that the SDK's task groups and a server that dies mid-run never cancel the
iteration itself; a call on a dead session fails like any tool call. A server that cannot be
reached, answers garbage or does not list its tools in time is left out with a readable reason
(``OpenedSources.problems``), or raises ``ToolSourceError`` when it is ``required``.

No database connection is held here: the servers' configuration came with the claimed mission.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from planner import ToolContext, ToolSpec
from planner.tools import PolicyHint, ToolHandler
from worker import metrics
from worker.errors import ManaAIError
from worker.mcp.config import redact_url
from worker.mcp.guard import SessionGuard
from worker.mcp.translate import McpToolError, result_value, tool_spec
from worker.mcp.wire import MAX_MESSAGE_BYTES, WireLimits, is_lost_reply
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "MAX_TOOLS_PER_SERVER",
    "McpToolSources",
    "OpenedSources",
    "ToolSourceError",
]


IDEMPOTENCY_META_KEY = "mana-ai/idempotency-key"
"""The ``_meta`` key of a ``tools/call`` request that carries a write or destructive call's
idempotency key (the same for every attempt at that call): a server that applies each key at
most once makes a call a dead worker left in flight safe to retry."""

logger = logging.getLogger(__name__)

MAX_TOOLS_PER_SERVER = 128
"""Tools taken from one server at most (OpenAI's limit for a whole request is 128)."""
MAX_LIST_PAGES = 20
"""``tools/list`` pages read at most (a paginator that never ends cannot hang a run)."""
_SDK_MODULES = ("mcp", "mcp.client.stdio", "mcp.client.streamable_http", "httpx2")
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


class ToolSourceError(ManaAIError):
    """A required MCP server could not be used; the message says which and why (no secret)."""


@dataclass
class OpenedSources:
    """What ``McpToolSources.open`` found: the tools to offer, and the readable reasons of what
    was left out (a server that failed, a tool that could not be used)."""

    tools: list[ToolSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class McpToolSources:
    """Opens an iteration's MCP servers (see the module docstring).

    Args:
        list_timeout_s: seconds to connect to a server and list its tools.
        max_result_chars: characters of one tool result the agent gets at most (its reply
            is read up to ``WireLimits.for_result_chars(max_result_chars)`` bytes).
        call_timeout_s: seconds one call may wait for the server's answer; set it above the
            loop's tool timeout, which stops a call first with its own message.
    """

    def __init__(
        self,
        *,
        list_timeout_s: float = 10.0,
        max_result_chars: int = 20_000,
        call_timeout_s: float = 65.0,
    ) -> None:
        self.list_timeout_s = list_timeout_s
        self.max_result_chars = max_result_chars
        self.limits = WireLimits.for_result_chars(max_result_chars)
        self.call_timeout_s = call_timeout_s
        # the SDK's import takes about half a second: pay it when the worker starts, not
        # inside a tick, where it would stall the event loop of every running mission
        for module in _SDK_MODULES:
            importlib.import_module(module)

    async def open(
        self,
        servers: Sequence[McpServerConfig],
        stack: contextlib.AsyncExitStack,
        *,
        reserved: Collection[str] = (),
    ) -> OpenedSources:
        """Connect to ``servers`` at once, list their tools and return them as ``ToolSpec``s;
        the sessions close when ``stack`` does. ``reserved`` are names already taken (the
        built-in tools): an MCP tool never replaces one.

        Raises:
            ToolSourceError: a ``required`` server failed (the others are closed again).
        """
        opened = OpenedSources()
        if not servers:
            return opened
        sessions = [_Session(server, self) for server in servers]
        for session in sessions:
            stack.push_async_callback(session.close)
        outcomes = await asyncio.gather(*(s.start() for s in sessions))
        taken = set(reserved)
        for session, failure in zip(sessions, outcomes, strict=True):
            server = session.server
            if failure is not None:
                metrics.MCP_SOURCE_FAILURES.inc()
                reason = f"MCP server {server.describe()}: {failure}"
                if server.required:
                    logger.error("%s; it is required, so the iteration fails", reason)
                    raise ToolSourceError(f"{reason} (the server is required)")
                logger.warning("%s; the run goes on without its tools", reason)
                opened.problems.append(f"{reason}; this run went on without its tools")
                continue
            specs, problems = session.tool_specs(taken)
            taken.update(s.name for s in specs)
            opened.tools.extend(specs)
            for problem in problems:
                logger.warning("MCP server %s: %s", server.describe(), problem)
                opened.problems.append(f"MCP server {server.name}: {problem}")
        return opened


class _Session:
    """One server's client session, owned by a task of its own."""

    def __init__(self, server: McpServerConfig, sources: McpToolSources) -> None:
        self.server = server
        self.sources = sources
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

        server, limits = self.server, self.sources.limits
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
