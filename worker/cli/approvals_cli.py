"""``mana-ai approvals``: destructive calls waiting for a person
(``MANA_AI_POLICY_DESTRUCTIVE=ask``) and the decisions on them."""

from __future__ import annotations

import argparse
import getpass
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from worker.admin.deciding import MAX_NOTE_CHARS
from worker.cli.args import UsageError, group, json_flag, limit, row_id
from worker.cli.output import emit, fields, fmt, print_json, table
from worker.cli.stores import approval_store
from worker.errors import ManaAIError
from worker.terminal_text import visible, visible_line

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["STATUSES", "register"]

STATUSES = ("pending", "approved", "denied", "expired")


def register(commands: Any) -> None:
    """Add ``approvals list|show|approve|deny``."""
    ap = group(
        commands,
        "approvals",
        "Approvals: destructive calls waiting for a person (MANA_AI_POLICY_DESTRUCTIVE=ask), "
        "and the decisions on them.",
    )
    lst = ap.add_parser(
        "list",
        help="List approval requests.",
        description="List approval requests, newest first. A pending request past its time "
        "to live (MANA_AI_APPROVAL_TTL_S) shows as expired.",
    )
    lst.add_argument("--status", choices=STATUSES, help="only requests in this status")
    lst.add_argument("--limit", type=limit, default=100, help="rows at most (100)")
    json_flag(lst)
    lst.set_defaults(command_fn=_list)

    show = ap.add_parser(
        "show",
        help="Show one approval request: the call, why it was asked, the decision.",
        description="Show one approval request: the call exactly as it would run, who asked "
        "(user, agent, mission, iteration, round), why, the model's text before the call, the "
        "decision, and what became of the call.",
    )
    show.add_argument("id", type=row_id, help="approval request id")
    json_flag(show)
    show.set_defaults(command_fn=_show)

    for name, verb, option, about in (
        ("approve", "Approve", "--note", "a note kept with the decision"),
        ("deny", "Deny", "--reason", "why; the model reads it in the call's result"),
    ):
        cmd = ap.add_parser(
            name,
            help=f"{verb} a pending request.",
            description=f"{verb} a pending approval request. The first decision wins: a request "
            "decided already, expired, or whose run no longer waits is refused (exit 1). A "
            "mission's parked run goes on at once (workers that listen for wake-ups), else at "
            "the next tick"
            + (
                ": exactly the reviewed call runs, once."
                if name == "approve"
                else ": the call does not run, and the model is told who denied it and why."
            ),
        )
        cmd.add_argument("id", type=row_id, help="approval request id")
        cmd.add_argument(
            "--by",
            metavar="NAME",
            help="who decides, kept with the decision (default: your login name)",
        )
        cmd.add_argument(
            option, dest="note", metavar="TEXT", help=f"{about} (at most {MAX_NOTE_CHARS} chars)"
        )
        other = "--reason" if name == "approve" else "--note"
        cmd.add_argument(other, dest="misplaced", help=argparse.SUPPRESS)
        json_flag(cmd)
        cmd.set_defaults(command_fn=_approve if name == "approve" else _deny)


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    async with approval_store(settings) as store:
        rows = await store.list_requests(status=args.status, limit=args.limit)
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        row["decided"] = _decision_cell(row)
    table(
        rows,
        [
            "id",
            "status",
            "tool",
            "user_id",
            "agent",
            "mission_id",
            "iteration_id",
            "target",
            "created_at",
            "decided",
        ],
    )
    return 0


def _decision_cell(row: dict[str, Any]) -> str:
    if row["status"] == "pending":
        return f"expires {fmt(row['expires_at'])}"
    if row["status"] == "expired":
        return f"expired {fmt(row.get('decided_at') or row['expires_at'])}"
    return f"by {row.get('decided_by') or '?'} {fmt(row.get('decided_at'))}"


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    from worker.queries.stored import decided_text

    async with approval_store(settings) as store:
        row = await store.get(args.id)
    if args.json:
        print_json(row)
        return 0
    where = (
        f"mission {row['mission_id']} (agent {visible_line(str(row.get('agent') or '?'))}), "
        f"iteration {row['iteration_id']}, round {row['round']}"
        if row["consumer"] == "mission"
        else f"an MCP client (token {row.get('mcp_token_id') or 'stdio'})"
    )
    print(f"approval request {row['id']}: {visible_line(decided_text(row))}")
    if not row["arguments_intact"]:
        print(
            "  warning: the stored arguments no longer match their hash (the row was edited): "
            "this request cannot be decided"
        )
    fields(
        {
            "call": f"{row['tool']}({json.dumps(row['arguments'], ensure_ascii=False)})",
            "user": row["user_id"],
            "asked by": where,
            "objective": row.get("objective") or "-",
            "acts on": row.get("target") or "- (the tool does not say)",
            "why": row["reason"],
            "model's text": row.get("reply_text") or "-",
            "asked at": row["created_at"],
            "expires at": row["expires_at"],
            "outcome": _outcome_text(row),
        }
    )
    return 0


def _outcome_text(row: dict[str, Any]) -> str:
    """What became of the call, in words."""
    if row["consumer"] != "mission":
        until = fmt(row["expires_at"])
        if row["status"] == "approved":
            if row.get("used_at"):
                return f"ran ({fmt(row['used_at'])})"
            if row["expires_at"] <= datetime.now(UTC):
                return "not run: the approval lapsed unused"
            return f"may run once, when the client makes this call again (until {until})"
        if row["status"] == "denied":
            return f"refused: the client is told who denied it until {until}"
        return "-" if row["status"] == "expired" else "waiting for a decision"
    outcome, reason = row.get("call_outcome"), row.get("call_reason")
    if row.get("iteration_status") is None:
        return "its iteration no longer exists"
    if row["status"] == "pending":
        return f"waiting (iteration {row['iteration_status']})"
    if outcome in ("parked", None):
        if row.get("iteration_status") != "awaiting_approval":
            return f"not run: its run ended (iteration {row['iteration_status']})"
        return f"not run yet: the run goes on at the next claim (mission {row['mission_status']})"
    text = {
        "ok": "ran: ok",
        "error": "ran: it failed",
        "unknown": "ran, outcome unknown (its worker stopped during the call)",
        "started": "running",
        "denied": "not run",
    }.get(str(outcome), str(outcome))
    return f"{text} ({reason})" if outcome == "denied" and reason else text


async def _approve(args: argparse.Namespace, settings: Settings) -> int:
    return await _decide(args, settings, approve=True)


async def _deny(args: argparse.Namespace, settings: Settings) -> int:
    return await _decide(args, settings, approve=False)


async def _decide(args: argparse.Namespace, settings: Settings, *, approve: bool) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from worker.admin.deciding import decide

    if args.misplaced is not None:
        raise UsageError(
            "approve takes --note (a note kept with the approval); --reason goes with deny"
            if approve
            else "deny takes --reason (the model reads it); --note goes with approve"
        )

    def label(field: str) -> str:
        return {"by": "--by", "note": "--note" if approve else "--reason"}[field]

    by = args.by if args.by is not None else _login()
    async with approval_store(settings) as store:
        try:
            row = await decide(store, args.id, approve=approve, by=by, note=args.note, labels=label)
        except (OSError, SQLAlchemyError) as exc:  # the answer was lost: say what may be true
            from worker.db.transient import describe_error

            raise ManaAIError(
                f"the database failed while deciding approval request {args.id} "
                f"({describe_error(exc)}): the decision may or may not be stored; check with "
                f"`mana-ai approvals show {args.id}`"
            ) from None
    verb = "approved" if approve else "denied"
    text = f"approval request {row['id']} ({row['tool']}) {verb} by {row['decided_by']}"
    if row["consumer"] == "mission":
        mission = f"mission {row['mission_id']}"
        if row.get("mission_status") == "paused":
            text += f"; {mission} is paused: its run goes on once it is resumed"
        else:
            text += f"; the run of {mission} goes on at once (or at the next tick)"
    elif approve:
        text += f"; user {row['user_id']}'s MCP client may now make this exact call once"
    emit(args, row, visible(text))
    return 0


def _login() -> str:
    """Who runs the command (the default ``--by``)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without a passwd entry)
        return "unknown"
