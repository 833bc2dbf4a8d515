"""Built-in tool packs: the notes workspace (``notes_*``), the clock (``clock_now``) and the
web reader (``web_fetch``).

``web_fetch`` is *opt-in*: an agent without an allow-list of tools gets every built-in tool
except the ones in ``OPT_IN_TOOLS``; it gets ``web_fetch`` only when its allow-list names it.
Reading the web exposes an agent to untrusted text (prompt injection) and, next to the notes
tools, gives it a way to send the user's data out (a URL is a message), so a person decides
per agent.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import cast

from sqlalchemy.ext.asyncio import AsyncEngine

from planner.tools import ToolSpec
from worker.tools.clock import clock_tools, utc_now
from worker.tools.notes import notes_tools
from worker.tools.web import WebFetchConfig, web_tools

__all__ = [
    "BUILTIN_SCOPES",
    "OPT_IN_TOOLS",
    "WebFetchConfig",
    "builtin_tool_catalog",
    "builtin_tools",
    "clock_tools",
    "notes_tools",
    "web_tools",
]

BUILTIN_SCOPES = ("notes", "clock", "web")

OPT_IN_TOOLS = frozenset({"web_fetch"})
"""Built-in tools an agent gets only when its allow-list names them."""


def builtin_tools(
    engine: AsyncEngine,
    now: Callable[[], datetime] = utc_now,
    web: WebFetchConfig | None = None,
) -> list[ToolSpec]:
    """Every built-in tool: the notes tools on ``engine``, the clock reading ``now``, then
    ``web_fetch`` under ``web`` (default ``WebFetchConfig()``: public addresses only)."""
    return [*notes_tools(engine), *clock_tools(now), *web_tools(web)]


def builtin_tool_catalog() -> list[ToolSpec]:
    """The built-in tools for their names, policy hints, scopes and schemas only (to check a
    command line without a database): their handlers are bound to no database and must not
    be called."""
    return builtin_tools(cast(AsyncEngine, None))
