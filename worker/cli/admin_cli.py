"""``mana-ai admin``: who may use the HTTP API and the console (``mana-ai serve``)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from worker.cli.args import checked_name, json_flag, row_id
from worker.cli.output import emit, print_json, table
from worker.terminal_text import visible_line

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``admin token create|list|revoke``."""
    admin = commands.add_parser(
        "admin",
        help="Admin tokens of the HTTP API and console (mana-ai serve).",
        description="Admin tokens of the HTTP API and console (mana-ai serve): who may read "
        "and steer missions over HTTP.",
    )
    groups = admin.add_subparsers(title="commands", metavar="COMMAND", required=True)
    token = groups.add_parser(
        "token",
        help="Admin tokens: create, list, revoke.",
        description="Bearer tokens of `mana-ai serve`. A token is sent as 'Authorization: "
        "Bearer TOKEN' to the API, or given once on the console's sign-in page. A --read-only "
        "token reads everything and changes nothing.",
    )
    tokens = token.add_subparsers(title="commands", metavar="COMMAND", required=True)
    create = tokens.add_parser(
        "create",
        help="Create a token; it is printed once.",
        description="Create an admin token for NAME (a person or a service; kept with every "
        "decision it takes) and print it once: only its SHA-256 is stored.",
    )
    create.add_argument("name", help="who holds the token, e.g. 'alice' or 'ci'")
    create.add_argument(
        "--read-only", action="store_true", help="the token may read, never change anything"
    )
    json_flag(create)
    create.set_defaults(command_fn=_create)
    lst = tokens.add_parser(
        "list",
        help="List tokens (never the tokens themselves).",
        description="List admin tokens: id, name, read-only, created, last used, revoked.",
    )
    json_flag(lst)
    lst.set_defaults(command_fn=_list)
    revoke = tokens.add_parser(
        "revoke",
        help="Revoke a token by id; its next request gets 401.",
        description="Revoke an admin token by its id (see `mana-ai admin token list`): its "
        "next API request gets 401, and the console sessions signed in with it end.",
    )
    revoke.add_argument("id", type=row_id, help="the token's id")
    json_flag(revoke)
    revoke.set_defaults(command_fn=_revoke)


async def _create(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.queries.admin_tokens import AdminTokenStore

    name = checked_name(args.name, "the token's name")
    async with database(settings) as engine:
        row, token = await AdminTokenStore(engine).create_token(name, read_only=args.read_only)
    if args.json:
        print_json(row | {"token": token})
        return 0
    kind = "read-only admin token" if args.read_only else "admin token"
    print(f"{kind} {row['id']} for {visible_line(name)}:")
    print(token)
    print(
        "Keep it now: only its hash is stored, it cannot be shown again. Send it as "
        "'Authorization: Bearer <token>' to the API, or sign in to the console with it; "
        f"`mana-ai admin token revoke {row['id']}` ends it.",
        file=sys.stdout,
    )
    return 0


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.queries.admin_tokens import AdminTokenStore

    async with database(settings) as engine:
        rows = await AdminTokenStore(engine).list_tokens()
    if args.json:
        print_json(rows)
    else:
        table(rows, ["id", "name", "read_only", "created_at", "last_used_at", "revoked_at"])
    return 0


async def _revoke(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.queries.admin_tokens import AdminTokenStore

    async with database(settings) as engine:
        row, was_live = await AdminTokenStore(engine).revoke_token(args.id)
    name = visible_line(row["name"])
    text = f"admin token {row['id']} of {name} revoked"
    if not was_live:
        text = f"admin token {row['id']} of {name} was already revoked; unchanged"
    emit(args, row, text)
    return 0
