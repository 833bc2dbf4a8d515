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
from typing import TYPE_CHECKING

from worker import metrics, redaction
from worker.errors import ManaAIError

if TYPE_CHECKING:
    from planner import ToolSpec
    from worker.store.agent_servers import McpServerConfig

__all__ = [
    "McpToolSources",
    "OpenedSources",
    "ToolSourceError",
]


logger = logging.getLogger(__name__)

_SDK_MODULES = (
    "mcp",
    "mcp.client.stdio",
    "mcp.client.streamable_http",
    "httpx2",
    "worker.mcp.session",
    "worker.mcp.http_transport",
    "worker.mcp.stdio",
)
"""What a session needs, imported in a thread by the first ``open`` of a server."""
_sdk_loaded = False


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
        self.call_timeout_s = call_timeout_s

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
        # what a server (or anything else) echoes of its headers is never stored nor logged
        redaction.add_secrets(secret for server in servers for secret in server.secrets())
        await _load_sdk()
        from worker.mcp.session import McpSession

        sessions = [McpSession(server, self) for server in servers]
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


async def _load_sdk() -> None:
    """Import what a session needs (``_SDK_MODULES``), once per process, in a thread: about
    half a second that a worker whose agents use no MCP server never spends, and that does
    not stall the event loop of the missions running meanwhile."""
    global _sdk_loaded
    if not _sdk_loaded:
        await asyncio.to_thread(_import_sdk)
        _sdk_loaded = True


def _import_sdk() -> None:
    for module in _SDK_MODULES:
        importlib.import_module(module)
