"""``mana-ai mcp``: serve the tools to MCP clients, and their bearer tokens.

``mcp serve`` listens on MANA_AI_MCP_HOST:MANA_AI_MCP_PORT (streamable HTTP at ``/mcp``, each
request with ``Authorization: Bearer TOKEN``), or talks MCP on stdin/stdout with ``--stdio
--user USER``. ``mcp token create USER`` prints a new token once (only its hash is stored);
``mcp token revoke ID`` ends it at the next request.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from worker.cli.args import UsageError, checked_name, group, json_flag, row_id
from worker.cli.output import emit, print_json, table
from worker.terminal_text import visible_line

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``mcp serve`` and ``mcp token create|list|revoke``."""
    mcp = group(
        commands,
        "mcp",
        "The MCP server: the built-in tools for MCP clients, behind the policy gate.",
    )
    _register_serve(mcp)
    _register_token(mcp)


def _register_serve(mcp: Any) -> None:
    """``mcp serve``."""
    serve = mcp.add_parser(
        "serve",
        help="Serve the built-in tools to MCP clients (streamable HTTP, or --stdio).",
        description="Serve the built-in tools (their schemas, with readOnlyHint / "
        "destructiveHint from their policy hints) to MCP clients. Over streamable HTTP at "
        "http://MANA_AI_MCP_HOST:MANA_AI_MCP_PORT/mcp every request needs "
        "'Authorization: Bearer TOKEN' (`mana-ai mcp token create`); with --stdio the "
        "client starts this command and every call runs for --user. Every call passes the "
        "policy gate (MANA_AI_POLICY_MODE, the user's opt-ins and rate limits, "
        "MANA_AI_MCP_SCOPES) and is recorded with consumer 'mcp'. A database that does not "
        "answer yet is waited for up to MANA_AI_DB_START_WAIT_S (60 s). Runs until "
        "SIGTERM/SIGINT (or the stdio client closes).",
    )
    serve.add_argument(
        "--stdio", action="store_true", help="talk MCP on stdin/stdout instead of HTTP"
    )
    serve.add_argument("--user", help="with --stdio: the user every call runs for")
    serve.set_defaults(command_fn=_serve, verbose_logs=True)


def _register_token(mcp: Any) -> None:
    """``mcp token create|list|revoke``."""
    token = mcp.add_parser(
        "token",
        help="Bearer tokens of MCP clients: create, list, revoke.",
        description="Bearer tokens of MCP clients. A token acts for one user: its calls meet "
        "that user's destructive opt-ins and rate limits.",
    )
    tokens = token.add_subparsers(title="commands", metavar="COMMAND", required=True)
    create = tokens.add_parser(
        "create",
        help="Create a token for a user; it is printed once.",
        description="Create a bearer token for USER and print it once: only its SHA-256 is "
        "stored, so it cannot be shown again (create another if it is lost).",
    )
    create.add_argument("user", help="user id (an agent's --owner)")
    create.add_argument("--label", help="what the token is for, e.g. 'laptop claude desktop'")
    json_flag(create)
    create.set_defaults(command_fn=_create)

    lst = tokens.add_parser(
        "list",
        help="List tokens (never the tokens themselves).",
        description="List tokens: id, user, label, created, revoked. The tokens themselves "
        "are not stored.",
    )
    lst.add_argument("user", nargs="?", help="only this user's tokens")
    json_flag(lst)
    lst.set_defaults(command_fn=_list)

    revoke = tokens.add_parser(
        "revoke",
        help="Revoke a token by id; its next request gets 401.",
        description="Revoke a token by its id (see `mana-ai mcp token list`): every later "
        "request with it gets 401 and runs nothing.",
    )
    revoke.add_argument("id", type=row_id, help="the token's id")
    json_flag(revoke)
    revoke.set_defaults(command_fn=_revoke)


async def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database_answers, served_tools
    from worker.daemon.tools_setup import check_policy_settings
    from worker.tools import builtin_tool_catalog

    if args.stdio:
        if args.user is None:
            raise UsageError("--stdio needs --user USER: the user every call runs for")
        user = checked_name(args.user, "--user")
    elif args.user is not None:
        raise UsageError("--user goes with --stdio; over HTTP each client's token names its user")
    scopes = ", ".join(settings.mcp.scopes) or "every scope"
    check_policy_settings(settings, builtin_tool_catalog())  # exit 2 before the database
    if not await database_answers(settings):  # started before its database: wait for it
        return 0
    async with served_tools(settings) as (served, store):
        if args.stdio:
            from worker.mcp.server import serve_stdio

            print(
                f"mana-ai: serving MCP on stdio for user {user} (policy mode "
                f"{settings.policy.mode}; scopes: {scopes})",
                file=sys.stderr,
            )
            await serve_stdio(served, user=user)
            return 0

        from worker.asgi_server import cannot_listen
        from worker.mcp.server import McpHttpServer, build_http_app

        app = build_http_app(served, store, host=settings.mcp.host)
        try:
            server = McpHttpServer(app, settings.mcp.host, settings.mcp.port)
        except OSError as exc:
            raise cannot_listen(exc, settings.mcp.host, settings.mcp.port, "MANA_AI_MCP") from None
        await server.serve_until_signalled(
            f"mana-ai: serving MCP at {server.url} (bearer tokens; policy mode "
            f"{settings.policy.mode}; scopes: {scopes})"
        )
    return 0


async def _create(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.queries.mcp_tokens import McpStore
    from worker.queries.user_policy import PolicyStore

    user = checked_name(args.user, "the user id")
    label = checked_name(args.label, "--label") if args.label is not None else None
    async with database(settings) as engine:
        row, token = await McpStore(engine).create_token(user, label=label)
        owns = await PolicyStore(engine).owns_agents(user)
    if not owns:
        print(
            f"mana-ai: note: no agent is owned by user {user!r} (yet); the token's calls act in "
            "that user's space (notes, opt-ins, rate limits)",
            file=sys.stderr,
        )
    if args.json:
        print_json(row | {"token": token})
        return 0
    print(f"MCP token {row['id']} for user {user}" + (f" ({label})" if label else "") + ":")
    print(token)
    print(
        "Keep it now: only its hash is stored, it cannot be shown again. Clients send it as "
        "'Authorization: Bearer <token>'; `mana-ai mcp token revoke "
        f"{row['id']}` ends it."
    )
    return 0


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.queries.mcp_tokens import McpStore

    user = checked_name(args.user, "the user id") if args.user is not None else None
    async with database(settings) as engine:
        rows = await McpStore(engine).list_tokens(user)
    if args.json:
        print_json(rows)
    else:
        table(rows, ["id", "user_id", "label", "created_at", "revoked_at"])
    return 0


async def _revoke(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.queries.mcp_tokens import McpStore

    async with database(settings) as engine:
        row, was_live = await McpStore(engine).revoke_token(args.id)
    user = visible_line(row["user_id"])
    if was_live:
        text = f"MCP token {row['id']} of user {user} revoked"
    else:
        text = f"MCP token {row['id']} of user {user} was already revoked; unchanged"
    emit(args, row, text)
    return 0
