"""``mana-ai tick`` and ``mana-ai worker``: running missions."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from worker.cli.args import json_flag
from worker.cli.output import print_json

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``tick`` and ``worker``."""
    tick = commands.add_parser(
        "tick",
        help="Run one tick: claim due missions, run them, store iterations, exit.",
        description="Claim the due missions (up to MANA_AI_MAX_CONCURRENT_MISSIONS), run them, "
        "wait for them and exit. Exit status 1 if any run failed.",
    )
    tick.add_argument("--once", action="store_true", help="run a single tick (the default)")
    json_flag(tick)
    tick.set_defaults(command_fn=_tick, verbose_logs=True)

    worker = commands.add_parser(
        "worker",
        help="Run the daemon: tick every MANA_AI_TICK_INTERVAL_S until SIGTERM/SIGINT.",
        description="Run the daemon. Waits up to MANA_AI_DB_START_WAIT_S (60 s) for an "
        "external database that does not answer yet, migrates the schema, serves /metrics and "
        "/healthz on MANA_AI_METRICS_PORT, and on SIGTERM/SIGINT stops claiming, lets running "
        "missions finish within MANA_AI_SHUTDOWN_GRACE_S and exits 0.",
    )
    worker.set_defaults(command_fn=_worker, verbose_logs=True)


async def _tick(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import announce_database
    from worker.daemon.app import open_app
    from worker.daemon.tools_setup import check_policy_settings
    from worker.tools import builtin_tool_catalog

    check_policy_settings(settings, builtin_tool_catalog())  # exit 2 before the database
    announce_database(settings)
    # SIGTERM (systemd, timeout, cron's kill) ends the tick as SIGINT does: the runs under way
    # are cancelled, marked interrupted and their leases released, so the next claim resumes
    # them at once instead of after the lease
    import asyncio  # (loaded by asyncio.run already; `--help` does without it)

    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    terminated = False

    def terminate() -> None:
        nonlocal terminated
        terminated = True
        if task is not None:
            task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, terminate)
        handled = True
    except (RuntimeError, ValueError):  # not the main thread (main() called by a program)
        handled = False
    try:
        async with open_app(settings) as app:
            outcomes = await app.worker.run_once()
    except asyncio.CancelledError:
        if not terminated:
            raise
        print("mana-ai: stopped by SIGTERM; runs under way were interrupted", file=sys.stderr)
        return 143
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGTERM)
    if args.json:
        print_json({"missions_run": len(outcomes), "outcomes": outcomes})
    else:
        print(f"tick ran {len(outcomes)} mission(s): {', '.join(outcomes) or 'none due'}")
    return 1 if any(o in ("failed", "error") for o in outcomes) else 0


async def _worker(args: argparse.Namespace, settings: Settings) -> int:

    from worker.cli.stores import announce_database, database_answers
    from worker.daemon.serve import serve
    from worker.daemon.tools_setup import check_policy_settings
    from worker.tools import builtin_tool_catalog

    check_policy_settings(settings, builtin_tool_catalog())  # exit 2 before the database
    announce_database(settings)
    if not await database_answers(settings):
        return 0
    return await serve(settings)
