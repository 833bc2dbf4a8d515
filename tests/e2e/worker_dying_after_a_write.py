"""``mana-ai worker`` whose ``notes_create`` kills its own process (SIGKILL) right after the
note is committed, before the worker can record the call's outcome: the harshest moment for
a worker to die. Run as ``python -m tests.e2e.worker_dying_after_a_write`` with the worker's
usual environment."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import worker.daemon.app
from planner import ToolContext, ToolSpec
from worker.cli import main

_builtin_tools = worker.daemon.app.builtin_tools


def _tools_that_die_after_a_write(*args: Any, **kwargs: Any) -> list[ToolSpec]:
    tools = _builtin_tools(*args, **kwargs)
    create = next(t for t in tools if t.name == "notes_create")

    async def create_then_die(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        await create.handler(arguments, ctx)  # the note is committed
        os.kill(os.getpid(), signal.SIGKILL)  # and the worker dies before recording it

    dying = dataclasses.replace(create, handler=create_then_die)
    return [dying if t.name == "notes_create" else t for t in tools]


if __name__ == "__main__":
    worker.daemon.app.builtin_tools = _tools_that_die_after_a_write  # type: ignore[assignment]
    raise SystemExit(main(["worker"]))
