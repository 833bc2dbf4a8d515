"""``mana-ai iterations``: stored mission runs."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.cli.args import group, iteration_ref, json_flag, limit, row_id
from worker.cli.output import fmt, print_json, table
from worker.cli.stores import admin_store, read_only
from worker.queries.stored import StoredAttempt, StoredIteration
from worker.terminal_text import visible, visible_line

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

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
    from worker.admin.verdict import with_warnings
    from worker.queries.reads import answers_of, get_mission, list_iterations

    async def read(conn: AsyncConnection) -> list[dict[str, Any]]:
        if args.mission is not None:
            await get_mission(conn, args.mission)  # NotFoundError (exit 1) rather than "(none)"
        rows = await list_iterations(conn, mission_id=args.mission, limit=args.limit)
        return with_warnings(rows, await answers_of(conn, [r["id"] for r in rows]))

    rows = await read_only(settings, read)
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
                "warning",
            ],
        )
    return 0


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.replay import ReplayError, checked_iteration
    from worker.admin.verdict import verdict

    async with admin_store(settings) as admin:
        it = await admin.get_iteration(await admin.iteration_id_or_latest(args.id))
    if args.json:
        print_json(it)
        return 0
    try:
        checked_iteration(it)
    except ReplayError as exc:  # edited by hand or corrupt: show it as stored, say what is wrong
        print_json(it)
        print(
            f"mana-ai: error: iteration {it['id']} cannot be shown as a conversation: {exc} "
            "(printed as stored above)",
            file=sys.stderr,
        )
        return 1
    folded = _print_summary(it)
    _print_log(
        it["messages"],
        it.get("reminders") or [],
        it.get("attempts") or [],
        folded_rounds=folded,
        it_id=it["id"],
    )
    _print_calls(it)
    print(f"\n{visible_line(verdict(it))}")
    return 0


def _print_summary(it: StoredIteration) -> int:
    """The iteration's outcome, times, usage, error, compactions and attempts; returns the
    turns its compactions folded."""
    print(
        f"iteration {it['id']} of mission {it['mission_id']}: {it['status']} "
        f"(attempt {it['attempt']}, worker {visible_line(it['worker_id'])})"
    )
    print(
        f"  scheduled for {fmt(it['scheduled_for'])}, started {fmt(it['started_at'])}, "
        f"{'parked' if it['status'] == 'awaiting_approval' else 'finished'} "
        f"{fmt(it['finished_at'])}"
    )
    infos = [m["reply_info"] for m in it["messages"] if m.get("reply_info")]
    estimated = any((i.get("usage") or {}).get("estimated") for i in infos)
    print(
        f"  rounds {it['rounds']}, tokens {it['prompt_tokens']} prompt + "
        f"{it['completion_tokens']} completion"
        f"{' (partly estimated: the endpoint did not report all usage)' if estimated else ''}, "
        f"stop reason {visible_line(str(it['stop_reason']))}"
    )
    if it["error"]:
        print(f"  error: {visible_line(it['error'])}")
    done = [c for c in it.get("compactions") or [] if not c.get("error")]
    folded = sum(int(c.get("folded_turns") or 0) for c in done)
    if done:
        print(
            f"  compactions: {len(done)} ({folded} turn(s) folded into summaries; "
            f"`mana-ai replay {it['id']}` shows them in place)"
        )
    attempts = it.get("attempts") or []
    if len(attempts) > 1:
        print("  attempts: " + visible_line("; ".join(_attempt_text(a) for a in attempts)))
    return folded


def _print_calls(it: StoredIteration) -> None:
    """Every tool call with its outcome and policy decision, then the approval requests."""
    from worker.admin.replay_render import approval_text, policy_text

    print("\ntool calls:")
    if not it["tool_invocations"]:
        print("  (none)")
    for inv in it["tool_invocations"]:
        detail = (
            f"error: {inv['error']}" if inv["error"] else f"result: {json.dumps(inv['result'])}"
        )
        print(
            f"  round {inv['round']} {visible_line(inv['tool'])}({json.dumps(inv['arguments'])}) "
            f"{inv['outcome']} in {inv['duration_ms']:.1f} ms; {visible_line(detail)}"
        )
        policy = policy_text(inv.get("policy_decision"), inv.get("policy_mode"))
        if policy:
            print(f"    policy: {visible_line(policy)}")
    approvals = it.get("approvals") or []
    if approvals:
        print("\napprovals (destructive calls a person was asked about):")
    for approval in approvals:
        print(
            f"  round {approval.get('round')} {visible_line(str(approval.get('tool')))}"
            f"({json.dumps(approval.get('arguments'), ensure_ascii=False)}): "
            f"{visible_line(approval_text(approval))}"
        )


def _attempt_text(attempt: StoredAttempt) -> str:
    from worker.admin.replay import after_approval

    text = f"{attempt.get('attempt')} by {attempt.get('worker_id')}"
    resumed = attempt.get("resumed_after_round")
    if resumed is not None:
        text += f" (resumed after round {resumed}" if resumed else " (started over"
        text += ", after the approval decision)" if after_approval(attempt) else ")"
    return text


def _print_log(
    messages: list[dict[str, Any]],
    reminders: list[dict[str, Any]],
    attempts: list[StoredAttempt] | None = None,
    *,
    folded_rounds: int = 0,
    it_id: Any = None,
) -> None:
    """The message log, round by round, with the reminders sent with each round's request
    under its header (they were never part of the stored log), and a line where a takeover
    resumed the run. A compacted log's rounds are numbered after the ``folded_rounds`` its
    summary stands for (those rounds, and their reminders, are ``mana-ai replay``'s)."""
    from worker.admin.replay import is_summary

    print("\nmessage log (reminders: sent with that round's request only, not in the log):")
    headers = _RoundHeaders.of(reminders, attempts or [])
    round_no = folded_rounds
    for folded in range(1, folded_rounds + 1):
        headers.by_round.pop(folded, None)
        headers.resumed.pop(folded, None)
    for message in messages:
        if message.get("role") == "assistant":
            round_no += 1
            headers.print_header(round_no)
        if folded_rounds and is_summary(message):
            print(
                f"  (rounds 1-{folded_rounds} were folded into the summary below; "
                f"`mana-ai replay {it_id}` shows them in place)"
            )
        _print_message(message)
    for leftover in sorted(headers.by_round):  # a round whose request got no answer
        headers.print_header(leftover, " (no answer)")


@dataclass
class _RoundHeaders:
    """The reminders and the takeovers still to print, by round (printed once each)."""

    by_round: dict[int, list[dict[str, Any]]]
    resumed: dict[int, list[StoredAttempt]]

    @classmethod
    def of(cls, reminders: list[dict[str, Any]], attempts: list[StoredAttempt]) -> _RoundHeaders:
        """Group ``reminders`` by round, and the takeovers by the round they resumed at."""
        by_round: dict[int, list[dict[str, Any]]] = {}
        for reminder in reminders:
            by_round.setdefault(int(reminder.get("round", 0)), []).append(reminder)
        resumed: dict[int, list[StoredAttempt]] = {}
        for attempt in attempts:
            after = attempt.get("resumed_after_round")
            if after:  # 0 or absent: that attempt started from the beginning
                resumed.setdefault(int(after) + 1, []).append(attempt)
        return cls(by_round, resumed)

    def print_header(self, round_no: int, note: str = "") -> None:
        """A round's header: the takeovers that resumed there, the line, its reminders."""
        from worker.admin.replay import after_approval

        for attempt in self.resumed.pop(round_no, []):
            why = " with the approval decision" if after_approval(attempt) else ""
            print(
                f"  == attempt {attempt.get('attempt')} "
                f"(worker {visible_line(str(attempt.get('worker_id')))}) "
                f"resumed here{why}, after round {round_no - 1} =="
            )
        print(f"  -- round {round_no}{note} --")
        for reminder in self.by_round.pop(round_no, []):
            print(
                f"  [reminder {visible_line(str(reminder.get('producer')))}] "
                f"{visible_line(str(reminder.get('text')))}"
            )


def _print_message(message: dict[str, Any]) -> None:
    """One message of the log: its content, then each tool call it made."""
    from worker.admin.replay_render import message_label

    label = message_label(message)
    if message.get("content") is not None:
        content = visible(str(message["content"])).replace("\n", "\n    ")
        print(f"  {visible_line(label)} {content}")
    for call in message.get("tool_calls", []):
        arguments = json.dumps(call.get("arguments", {}))
        if call.get("raw_arguments") is not None:
            arguments = f"<undecodable: {call['raw_arguments']!r}>"
        print(
            f"  {visible_line(label)} calls {visible_line(str(call['name']))}({arguments}) "
            f"id={visible_line(str(call['id']))}"
        )
