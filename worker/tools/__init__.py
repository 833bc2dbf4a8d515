"""Built-in tool packs: the notes workspace (``notes_*``) and the clock (``clock_now``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from planner.tools import ToolSpec
from worker.tools.clock import clock_tools, utc_now
from worker.tools.notes import notes_tools

__all__ = ["BUILTIN_SCOPES", "builtin_tools", "clock_tools", "notes_tools"]

BUILTIN_SCOPES = ("notes", "clock")


def builtin_tools(engine: AsyncEngine, now: Callable[[], datetime] = utc_now) -> list[ToolSpec]:
    """Every built-in tool: the notes tools on ``engine``, then the clock reading ``now``."""
    return [*notes_tools(engine), *clock_tools(now)]
