"""``mana-ai iterations``: stored mission runs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from worker.cli.args import group, iteration_ref, json_flag, limit, row_id
from worker.cli.output import fmt, print_json, table
from worker.cli.stores import admin_store
from worker.errors import NotFoundError
from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``iterations list|show``."""
    it = group(commands, "iterations", "Iterations: stored mission runs.")
    lst = it.add_parser(
        "list", help="List iterations.", description="List iterations, newest first."
    )
    lst.add_argument("--mission", type=row_id, help="only this mission's iterations")
    lst.add_argument("--limit", type=limit, default=20, help="rows at most (20)")
    json_flag(lst)
    lst.set_defaults(command_fn=_list)
    show = it.add_parser(
        "show",
        help="Show one iteration: its message log and tool calls.",
        description="Show one iteration: outcome, usage, the stored message log and every tool "
        "call with its arguments, result or error.",
    )
    show.add_argument("id", type=iteration_ref, help="iteration id, or 'latest'")
    json_flag(show)
    show.set_defaults(command_fn=_show)


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    async with admin_store(settings) as admin:
        if args.mission is not None:
            await admin.get_mission(args.mission)  # NotFoundError (exit 1) rather than "(none)"
        rows = await admin.list_iterations(mission_id=args.mission, limit=args.limit)
    if args.json:
        print_json(rows)
    else:
        for row in rows:
            row["tokens"] = row["prompt_tokens"] + row["completion_tokens"]
        table(
            rows,
            [
                "id",
                "mission_id",
                "scheduled_for",
                "status",
                "attempt",
                "rounds",
                "tokens",
                "stop_reason",
                "error",
            ],
        )
    return 0


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    async with admin_store(settings) as admin:
        iteration_id = args.id
        if iteration_id is None:
            latest = await admin.list_iterations(limit=1)
            if not latest:
                raise NotFoundError("no iterations stored yet (run `mana-ai tick --once`)")
            iteration_id = latest[0]["id"]
        it = await admin.get_iteration(iteration_id)
    if args.json:
        print_json(it)
        return 0
    print(
        f"iteration {it['id']} of mission {it['mission_id']}: {it['status']} "
        f"(attempt {it['attempt']}, worker {it['worker_id']})"
    )
    print(
        f"  scheduled for {fmt(it['scheduled_for'])}, started {fmt(it['started_at'])}, "
        f"finished {fmt(it['finished_at'])}"
    )
    infos = [m["reply_info"] for m in it["messages"] if m.get("reply_info")]
    estimated = any((i.get("usage") or {}).get("estimated") for i in infos)
    print(
        f"  rounds {it['rounds']}, tokens {it['prompt_tokens']} prompt + "
        f"{it['completion_tokens']} completion"
        f"{' (partly estimated: the endpoint did not report all usage)' if estimated else ''}, "
        f"stop reason {it['stop_reason']}"
    )
    if it["error"]:
        print(f"  error: {it['error']}")
    _print_log(it["messages"], it.get("reminders") or [])
    print("\ntool calls:")
    if not it["tool_invocations"]:
        print("  (none)")
    for inv in it["tool_invocations"]:
        detail = (
            f"error: {inv['error']}" if inv["error"] else f"result: {json.dumps(inv['result'])}"
        )
        print(
            f"  round {inv['round']} {inv['tool']}({json.dumps(inv['arguments'])}) "
            f"{inv['outcome']} in {inv['duration_ms']:.1f} ms; {detail}"
        )
        policy = _policy_line(inv.get("policy_decision"), inv.get("policy_mode"))
        if policy:
            print(f"    policy: {policy}")
    return 0


def _policy_line(decision: dict[str, Any] | None, mode: str | None) -> str | None:
    """E.g. ``denied: destructive_not_opted_in (enforce)``, ``would deny: rate_limited
    (log-only)``, ``allowed (enforce); flagged: injection_marker ['{{']``."""
    if not decision:
        return None
    mode = decision.get("mode") or mode or "?"
    reason = decision.get("reason") or "?"
    if decision.get("verdict", "allow" if decision.get("allow") else "deny") == "allow":
        line = f"allowed ({mode})"
    elif decision.get("allow"):
        line = f"would deny: {reason} ({mode})"
    else:
        line = f"denied: {reason} ({mode})"
    if decision.get("flags"):
        markers = decision.get("markers") or []
        line += f"; flagged: {', '.join(decision['flags'])}" + (f" {markers}" if markers else "")
    return line


def _print_log(messages: list[dict[str, Any]], reminders: list[dict[str, Any]]) -> None:
    """The message log, round by round, with the reminders sent with each round's request
    under its header (they were never part of the stored log)."""
    print("\nmessage log (reminders: sent with that round's request only, not in the log):")
    by_round: dict[int, list[dict[str, Any]]] = {}
    for reminder in reminders:
        by_round.setdefault(int(reminder.get("round", 0)), []).append(reminder)

    def header(round_no: int, note: str = "") -> None:
        print(f"  -- round {round_no}{note} --")
        for reminder in by_round.pop(round_no, []):
            print(f"  [reminder {reminder.get('producer')}] {reminder.get('text')}")

    round_no = 0
    for message in messages:
        role = message["role"]
        if role == "assistant":
            round_no += 1
            header(round_no)
        label = _message_label(message)
        if message.get("content") is not None:
            print(f"  {label} {message['content']}")
        for call in message.get("tool_calls", []):
            arguments = json.dumps(call.get("arguments", {}))
            if call.get("raw_arguments") is not None:
                arguments = f"<undecodable: {call['raw_arguments']!r}>"
            print(f"  {label} calls {call['name']}({arguments}) id={call['id']}")
    for leftover in sorted(by_round):  # a round whose request got no answer
        header(leftover, " (no answer)")


def _message_label(message: dict[str, Any]) -> str:
    """``[role]``, ``[tool <call id>]`` or ``[assistant via <endpoint>, finish_reason …]``.

    Provider fields (reasoning text, signatures) are left out here; ``--json`` shows them.
    """
    parts = [message["role"]]
    if message.get("tool_call_id"):
        parts.append(message["tool_call_id"])
    info = message.get("reply_info") or {}
    if info.get("endpoint"):
        parts.append(f"via {info['endpoint']}")
    label = " ".join(parts)
    if info.get("finish_reason") not in (None, "stop", "tool_calls"):
        label += f", finish_reason {info['finish_reason']}"
    return f"[{label}]"
