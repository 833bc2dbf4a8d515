"""``mana-ai worker`` whose write kills its own process (SIGKILL) right after the write is
committed, before the worker can do anything more: the harshest moment for a worker to die.
A built-in write commits its effect with its call's record (``MissionStore.run_effect``), so
the worker dies right after that commit; a write run by its own handler, right after it.
The tool is ``notes_create``, or the one named by ``DYING_TOOL`` (``notes_delete``: a
destructive call that ran on a person's approval). Run as
``python -m tests.e2e.worker_dying_after_a_write`` with the worker's usual environment."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import worker.daemon.app
from planner import ToolContext, ToolSpec
from worker.cli import main
from worker.store.postgres import PostgresMissionStore

_builtin_tools = worker.daemon.app.builtin_tools
DYING_TOOL = os.environ.get("DYING_TOOL", "notes_create")


def _tools_that_die_after_a_write(*args: Any, **kwargs: Any) -> list[ToolSpec]:
    tools = _builtin_tools(*args, **kwargs)
    write = next(t for t in tools if t.name == DYING_TOOL)

    async def write_then_die(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        await write.handler(arguments, ctx)  # the write is committed
        os.kill(os.getpid(), signal.SIGKILL)  # and the worker dies before recording it

    dying = dataclasses.replace(write, handler=write_then_die)
    return [dying if t.name == DYING_TOOL else t for t in tools]


_run_effect = PostgresMissionStore.run_effect


async def _run_effect_then_die(self: PostgresMissionStore, *args: Any, **kwargs: Any) -> Any:
    result = await _run_effect(self, *args, **kwargs)  # the write and its record committed
    os.kill(os.getpid(), signal.SIGKILL)
    return result


if __name__ == "__main__":
    worker.daemon.app.builtin_tools = _tools_that_die_after_a_write  # type: ignore[assignment]
    PostgresMissionStore.run_effect = _run_effect_then_die  # type: ignore[method-assign]
    raise SystemExit(main(["worker"]))
