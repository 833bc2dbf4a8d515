"""``mana-ai serve``: the HTTP API and the web console (``worker.api``)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from worker.errors import ManaAIError

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``serve``."""
    serve = commands.add_parser(
        "serve",
        help="Serve the HTTP API (/api/v1) and the web console (/).",
        description="Serve the JSON API under /api/v1 (OpenAPI at /api/v1/openapi.json) and "
        "the web console under / on http://MANA_AI_API_HOST:MANA_AI_API_PORT, with /healthz "
        "and /metrics. Every API request needs 'Authorization: Bearer TOKEN' and the console "
        "a sign-in with a token (`mana-ai admin token create NAME`). Runs until SIGTERM/SIGINT.",
    )
    serve.set_defaults(command_fn=_serve, verbose_logs=True)


async def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio  # (loaded by asyncio.run already; `--help` does without it)

    from worker.api.app import build_app
    from worker.asgi_server import AsgiServer
    from worker.cli.stores import database
    from worker.tools import builtin_tool_catalog

    catalog = builtin_tool_catalog()
    async with database(settings) as engine:
        app = build_app(
            engine,
            settings,
            known_tools=[t.name for t in catalog],
            hints={t.name: t.policy_hint for t in catalog},
        )
        try:
            server = AsgiServer(app, settings.api_host, settings.api_port)
        except OSError as exc:
            raise ManaAIError(
                f"cannot listen on {settings.api_host}:{settings.api_port} "
                f"({exc.strerror or exc}); set MANA_AI_API_HOST / MANA_AI_API_PORT"
            ) from None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        print(
            f"mana-ai: serving the API at {server.base_url}/api/v1 and the console at "
            f"{server.base_url}/ (admin tokens: `mana-ai admin token create NAME`)",
            file=sys.stderr,
            flush=True,
        )
        try:
            await server.serve()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return 0
