"""``mana-ai serve``: the HTTP API and the web console (``worker.api``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

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
        "a sign-in with a token (`mana-ai admin token create NAME`). It never runs missions "
        "(a worker does). Settings: MANA_AI_API_HOST (default 127.0.0.1), MANA_AI_API_PORT "
        "(8080; 0 picks one), MANA_AI_API_SESSION_TTL_S (console sign-ins, 43200), "
        "MANA_AI_API_MAX_BODY_BYTES (1048576), MANA_AI_CONSOLE_URL (the address people use, "
        "behind a proxy), and MANA_AI_DATABASE_URL (unset: the embedded PostgreSQL; a database "
        "of your own needs `mana-ai db upgrade` first). A database that does not answer yet "
        "is waited for up to MANA_AI_DB_START_WAIT_S (60 s). Runs until SIGTERM/SIGINT.",
    )
    serve.set_defaults(command_fn=_serve, verbose_logs=True)


class _AppLater:
    """The ASGI app the server is bound with before the app exists (it needs the database);
    set ``app`` before serving."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


async def _serve(args: argparse.Namespace, settings: Settings) -> int:

    from worker.api.app import build_app
    from worker.asgi_server import AsgiServer, cannot_listen
    from worker.cli.stores import database, database_answers
    from worker.tools import builtin_tool_catalog

    catalog = builtin_tool_catalog()
    app = _AppLater()
    try:  # bound first: an address it cannot have is a settings error at once (exit 2)
        server = AsgiServer(app, settings.api.host, settings.api.port)
    except OSError as exc:
        raise cannot_listen(exc, settings.api.host, settings.api.port, "MANA_AI_API") from None
    if not await database_answers(settings):  # started before its database: wait for it
        server.close()
        return 0
    async with database(settings, wait_s=settings.database.start_wait_s) as engine:
        app.app = build_app(
            engine,
            settings,
            known_tools=[t.name for t in catalog],
            hints={t.name: t.policy_hint for t in catalog},
        )
        await server.serve_until_signalled(
            f"mana-ai: serving the API at {server.base_url}/api/v1 and the console at "
            f"{server.base_url}/ (admin tokens: `mana-ai admin token create NAME`)"
        )
    return 0
