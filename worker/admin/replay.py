"""``mana-ai replay``: a stored iteration as the whole conversation, the turns compaction folded
restored in place from the ``compacted_turns`` archive.

``replay_events`` turns one iteration (``AdminStore.get_iteration``) into a list of events in
reading order; ``render_text`` and ``render_markdown`` print them; ``--format json`` prints
them as they are. Events (``"event"`` key):

* ``message``: one message of the restored log (``message`` as stored; ``round``: the round
  it belongs to, 0 for the head; ``folded_by``: the compaction that folded it first, or
  ``None``; ``calls``: on assistant messages, each tool call with the decision the policy gate
  took on it and its outcome, from ``tool_invocations``, and, when the gate asked a person
  about it, ``approval``: the request's ``id``, ``status``, ``decided_by``, ``decided_at``,
  ``decision_note``, ``expires_at``).
* ``round``: a round begins (``reminders`` sent with its request only; ``resumed_by``: the
  attempt that resumed the run here after a takeover).
* ``compaction``: where the turns that compaction ``index`` folded begin; ``summary`` is what
  the model read instead of them.
* ``compaction_end``: where they end.
* ``compaction_failed``: a compaction was tried before ``round`` and changed nothing.
* ``unanswered_round``: reminders of a round whose request got no answer.

Restoring: compaction k replaced ``folded`` (its archived messages) with one summary message
at ``start_index`` of the log it worked on; putting ``folded`` back there, the latest
compaction first, gives the conversation before it (``planner.compaction.restore``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.errors import ManaAIError
from worker.queries.stored import (
    StoredApproval,
    StoredAttempt,
    StoredCompaction,
    StoredInvocation,
    StoredIteration,
    decided_text,
)
from worker.terminal_text import visible

__all__ = [
    "ReplayError",
    "approval_text",
    "checked_iteration",
    "is_summary",
    "later_attempt_last",
    "md_inline",
    "message_label",
    "policy_text",
    "render_markdown",
    "render_text",
    "replay_document",
    "replay_events",
    "restored_log",
]

Row = dict[str, Any]

_SUMMARY_START = "<summary of "


class ReplayError(ManaAIError):
    """An iteration cannot be replayed or rerun: its log, archive or reminder audit is
    malformed (edited by hand, corrupt), its archive does not fit its log, or it stored no
    conversation at all."""


@dataclass
class _Item:
    """One message of the log being restored, with the marks that go around it."""

    message: Row
    folded_by: list[int] = field(default_factory=list)
    before: list[Row] = field(default_factory=list)
    after: list[Row] = field(default_factory=list)


def after_approval(attempt: StoredAttempt) -> bool:
    """True when ``attempt`` went on from a run parked for approval (a decision, not a
    fault: ``resumed_from`` is ``awaiting_approval``)."""
    return attempt.get("resumed_from") == "awaiting_approval"


def later_attempt_last(row: StoredInvocation) -> tuple[int, int]:
    """Sort key of stored ``tool_invocations`` rows: by attempt, then row id, so that where a
    takeover stored a call of the same ``(round, position)`` again, its row comes last (and
    wins when rows are keyed by position)."""
    return (int(row.get("attempt") or 1), int(row.get("id") or 0))


def restored_log(messages: Sequence[Row], compactions: Sequence[StoredCompaction]) -> list[Row]:
    """The iteration's conversation before any compaction: the stored ``messages`` with each
    compaction's folded messages put back in place of its summary message (the compactions
    that failed are ignored). Raises ReplayError when the archive does not fit the log."""
    return [item.message for item in _restore(messages, compactions)]


def _restore(messages: Sequence[Row], compactions: Sequence[StoredCompaction]) -> list[_Item]:
    items = [_Item(m) for m in messages]
    done = [c for c in compactions if not c.get("error")]
    for compaction in reversed(sorted(done, key=lambda c: c["compaction_index"])):
        index, start = compaction["compaction_index"], compaction["start_index"]
        summary = items[start] if 0 <= start < len(items) else None
        if summary is None or not is_summary(summary.message):
            raise ReplayError(
                f"the archive does not fit the log: compaction {index} replaced its turns "
                f"with a summary at message {start}, which the stored log does not have there"
            )
        folded = [_Item(m, [index, *summary.folded_by]) for m in compaction.get("folded") or []]
        if not folded:
            raise ReplayError(f"the archive does not fit the log: compaction {index} is empty")
        mark = {k: v for k, v in compaction.items() if k not in ("folded", "iteration_id")}
        folded[0].before = [
            *summary.before,
            {"event": "compaction", "index": index, **_mark_fields(mark)},
        ]
        folded[-1].after = [
            *folded[-1].after,
            {"event": "compaction_end", "index": index},
            *summary.after,
        ]
        items[start : start + 1] = folded
    return items


def _mark_fields(row: Row) -> Row:
    return {
        "before_round": row.get("round"),
        "folded_turns": row.get("folded_turns"),
        "summary": row.get("summary"),
        "tokens_before": row.get("tokens_before"),
        "tokens_after": row.get("tokens_after"),
        "model": row.get("model"),
        "duration_ms": row.get("duration_ms"),
        "attempt": row.get("attempt"),
    }


def is_summary(message: Row) -> bool:
    """True for the message a compaction put in place of the turns it folded."""
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, str)
        and content.startswith(_SUMMARY_START)
    )


def checked_iteration(iteration: StoredIteration) -> None:
    """Check what replay and rerun read of a stored iteration: its log and each archived
    compaction's folded messages are lists of messages with a role (tool calls with a name),
    its reminder audit is records of a round, a producer and a text.

    Raises:
        ReplayError: naming the part that is malformed (a row edited by hand, or corrupt).
    """
    _check_messages(iteration.get("messages"), "the stored message log")
    for row in iteration.get("compactions") or []:
        where = f"compaction {row.get('compaction_index')} of the archive"
        if not isinstance(row.get("compaction_index"), int) or not isinstance(
            row.get("round"), int
        ):
            raise ReplayError(f"{where} has no compaction index or round")
        if not row.get("error"):
            _check_messages(row.get("folded"), f"the folded messages of {where}")
            if not row.get("folded"):
                raise ReplayError(f"the archive does not fit the log: {where} is empty")
    for n, call in enumerate(iteration.get("tool_invocations") or [], start=1):
        decision = call.get("policy_decision") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not (decision is None or isinstance(decision, dict)):
            raise ReplayError(f"tool invocation {n} has a policy decision that is not an object")
    reminders = iteration.get("reminders") or []
    if not isinstance(reminders, list):
        raise ReplayError("the reminder audit is not a list")
    for n, reminder in enumerate(reminders, start=1):
        if not (
            isinstance(reminder, dict)
            and isinstance(reminder.get("round"), int)
            and isinstance(reminder.get("producer"), str)
            and isinstance(reminder.get("text"), str)
        ):
            raise ReplayError(f"reminder {n} of the audit is not a round, a producer and a text")


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list):
        raise ReplayError(f"{where} is not a list of messages")
    for n, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ReplayError(f"message {n} of {where} has no valid role")
        info = message.get("reply_info")
        if info is not None and not (
            isinstance(info, dict) and isinstance(info.get("usage") or {}, dict)
        ):
            raise ReplayError(f"message {n} of {where} has a reply_info that is not an object")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
        ):
            raise ReplayError(f"message {n} of {where} has a tool call without a name")


_ROLES = ("system", "user", "assistant", "tool")


def replay_events(iteration: StoredIteration) -> list[Row]:
    """The events of ``iteration`` (``AdminStore.get_iteration``'s row) in reading order; see
    the module docstring. Raises ReplayError when its log, archive or audit is malformed, or
    the archive does not fit the log."""
    checked_iteration(iteration)
    compactions = iteration.get("compactions") or []
    items = _restore(iteration.get("messages") or [], compactions)
    reminders: dict[int, list[Row]] = {}
    for reminder in iteration.get("reminders") or []:
        entry = {"producer": reminder.get("producer"), "text": reminder.get("text")}
        reminders.setdefault(int(reminder.get("round", 0)), []).append(entry)
    failed: dict[int, list[Row]] = {}
    for row in compactions:
        if row.get("error"):
            failed.setdefault(int(row["round"]), []).append(
                {
                    "event": "compaction_failed",
                    "index": row["compaction_index"],
                    "before_round": row["round"],
                    "error": row["error"],
                    "tokens_before": row.get("tokens_before"),
                    "model": row.get("model"),
                    "attempt": row.get("attempt"),
                }
            )
    resumed: dict[int, Row] = {}
    for attempt in iteration.get("attempts") or []:
        after = attempt.get("resumed_after_round")
        if after:
            resumed[int(after) + 1] = {
                "attempt": attempt.get("attempt"),
                "worker_id": attempt.get("worker_id"),
                "after_approval": after_approval(attempt),
            }
    invocations: dict[tuple[int, int], StoredInvocation] = {}
    for inv in sorted(iteration.get("tool_invocations") or [], key=later_attempt_last):
        invocations[(int(inv["round"]), int(inv.get("position") or 0))] = inv
    approvals: dict[tuple[int, int], StoredApproval] = {
        (int(a["round"] or 0), int(a["position"] or 0)): a for a in iteration.get("approvals") or []
    }

    events: list[Row] = []
    round_no = 0
    for item in items:
        message = item.message
        folded_by = item.folded_by[0] if item.folded_by else None
        events.extend(item.before)
        if message.get("role") == "assistant":
            round_no += 1
            events.extend(failed.pop(round_no, []))
            events.append(
                {
                    "event": "round",
                    "round": round_no,
                    "folded_by": folded_by,
                    "reminders": reminders.pop(round_no, []),
                    "resumed_by": resumed.pop(round_no, None),
                }
            )
        event: Row = {
            "event": "message",
            "round": round_no,
            "folded_by": folded_by,
            "message": message,
        }
        if message.get("role") == "assistant" and message.get("tool_calls"):
            event["calls"] = [
                _call(
                    call,
                    invocations.get((round_no, position)),
                    approvals.get((round_no, position)),
                )
                for position, call in enumerate(message["tool_calls"])
            ]
        events.append(event)
        events.extend(item.after)
    for round_left in sorted(set(failed) | set(reminders)):
        events.extend(failed.pop(round_left, []))
        if round_left in reminders:
            events.append(
                {
                    "event": "unanswered_round",
                    "round": round_left,
                    "reminders": reminders.pop(round_left),
                }
            )
    return events


def _call(
    call: Row, invocation: StoredInvocation | None, approval: StoredApproval | None = None
) -> Row:
    entry = {
        "id": call.get("id"),
        "name": call.get("name"),
        "arguments": call.get("arguments", {}),
    }
    if call.get("raw_arguments") is not None:
        entry["raw_arguments"] = call["raw_arguments"]
    if invocation is not None:
        entry |= {
            "outcome": invocation.get("outcome"),
            "policy_decision": invocation.get("policy_decision"),
            "policy_mode": invocation.get("policy_mode"),
            "duration_ms": invocation.get("duration_ms"),
        }
    if approval is not None:
        entry["approval"] = {
            key: approval.get(key)
            for key in ("id", "status", "decided_by", "decided_at", "decision_note", "expires_at")
        }
    return entry


def approval_text(approval: Mapping[str, Any]) -> str:
    """One line for an approval request: ``approval 12: approved by alice at …: note``,
    ``approval 12: pending until …``, ``approval 12: expired at … (nobody decided in time)``."""
    return f"approval {approval.get('id')}: {decided_text(approval)}"


def policy_text(decision: Row | None, mode: str | None) -> str | None:
    """One line for a policy decision: ``denied: destructive_not_opted_in (enforce)``,
    ``would deny: rate_limited (log-only)``, ``asks a person (enforce)``, ``allowed: approved
    (enforce)``, ``allowed (enforce); flagged: injection_marker ['{{']``; ``None`` without a
    decision (no gate ran)."""
    if not decision or not isinstance(decision, dict):
        return None
    mode = decision.get("mode") or mode or "?"
    reason = decision.get("reason") or "?"
    verdict = decision.get("verdict", "allow" if decision.get("allow") else "deny")
    if verdict == "allow":
        line = f"allowed ({mode})" if reason != "approved" else f"allowed: approved ({mode})"
    elif verdict == "ask":
        line = f"{'would ask' if decision.get('allow') else 'asks'} a person ({mode})"
    elif decision.get("allow"):
        line = f"would deny: {reason} ({mode})"
    else:
        line = f"denied: {reason} ({mode})"
    if decision.get("flags"):
        markers = decision.get("markers") or []
        line += f"; flagged: {', '.join(decision['flags'])}" + (f" {markers}" if markers else "")
    return line


def _arguments_text(call: Row) -> str:
    if call.get("raw_arguments") is not None:
        return f"<undecodable: {call['raw_arguments']!r}>"
    return json.dumps(call.get("arguments", {}), ensure_ascii=False)


def _call_suffix(call: Row) -> str:
    parts = []
    if call.get("outcome"):
        parts.append(str(call["outcome"]))
    policy = policy_text(call.get("policy_decision"), call.get("policy_mode"))
    if policy:
        parts.append(f"policy {policy}")
    if call.get("approval"):
        parts.append(approval_text(call["approval"]))
    return f" [{'; '.join(parts)}]" if parts else ""


def _header_lines(iteration: StoredIteration) -> list[str]:
    done = [c for c in iteration.get("compactions") or [] if not c.get("error")]
    failed = [c for c in iteration.get("compactions") or [] if c.get("error")]
    lines = [
        f"iteration {iteration['id']} of mission {iteration['mission_id']}: "
        f"{iteration['status']}, stop reason {iteration.get('stop_reason')}, "
        f"{iteration.get('rounds')} round(s), "
        f"{iteration.get('prompt_tokens', 0) + iteration.get('completion_tokens', 0)} tokens"
    ]
    if iteration.get("error"):
        lines.append(f"error: {iteration['error']}")
    lines.append(
        f"compactions: {len(done)}"
        + (f", {len(failed)} failed attempt(s)" if failed else "")
        + (
            " (folded turns restored in place below)"
            if done
            else " (the log is shown as the model saw it)"
        )
    )
    return lines


def render_text(
    iteration: StoredIteration, events: Sequence[Row], write: Callable[[str], None]
) -> None:
    """Plain text, one line per message or call (a message of several lines goes on, indented);
    folded turns are prefixed ``| `` (one bar per compaction that folded them) between the
    lines that open and close their compaction. Control and invisible characters (a bidi
    override, a terminal escape) are shown as escapes (``worker.terminal_text.visible``), never
    sent to the terminal."""
    for line in _header_lines(iteration):
        _write_text(write, "", line)
    depth = 0
    for event in events:
        kind = event["event"]
        bar = "| " * depth
        if kind == "compaction":
            _write_text(
                write,
                bar,
                f"== compaction {event['index']} before round {event['before_round']}: "
                f"{event['folded_turns']} turn(s) folded, {event['tokens_before']} -> "
                f"{event['tokens_after']} tokens (estimated), summarised by "
                f"{event.get('model') or 'the default model'} in "
                f"{float(event.get('duration_ms') or 0):.0f} ms. The model read this summary "
                f"instead of the turns marked '|':",
            )
            for line in str(event.get("summary") or "").splitlines():
                _write_text(write, bar, f"   > {line}")
            depth += 1
        elif kind == "compaction_end":
            depth = max(0, depth - 1)
            write(f"{'| ' * depth}== end of the turns compaction {event['index']} folded ==")
        elif kind == "compaction_failed":
            _write_text(
                write,
                bar,
                f"== compaction {event['index']} tried before round "
                f"{event['before_round']} changed nothing: {event['error']} ==",
            )
        elif kind in ("round", "unanswered_round"):
            resumed = event.get("resumed_by")
            if resumed:
                _write_text(
                    write,
                    bar,
                    f"== attempt {resumed['attempt']} (worker {resumed['worker_id']}) "
                    "resumed the run here ==",
                )
            note = " (no answer)" if kind == "unanswered_round" else ""
            write(f"{bar}-- round {event['round']}{note} --")
            for reminder in event.get("reminders") or []:
                _write_text(write, bar, f"[reminder {reminder['producer']}] {reminder['text']}")
        elif kind == "message":
            message = event["message"]
            label = message_label(message)
            if message.get("content") is not None:
                _write_text(write, bar, f"{label} {message['content']}")
            for call in event.get("calls") or []:
                _write_text(
                    write,
                    bar,
                    f"{label} calls {call['name']}({_arguments_text(call)}) "
                    f"id={call['id']}{_call_suffix(call)}",
                )


def _write_text(write: Callable[[str], None], bar: str, text: str) -> None:
    """``text`` line by line, each prefixed ``bar`` (the lines after the first indented)."""
    first, *rest = visible(str(text)).split("\n")
    write(f"{bar}{first}")
    for line in rest:
        write(f"{bar}    {line}")


def render_markdown(
    iteration: StoredIteration, events: Sequence[Row], write: Callable[[str], None]
) -> None:
    """Markdown: a heading per round, reminders as quotes, every text that came from a model,
    a tool or a prompt in a code block (fenced longer than any backtick run in it, so nothing
    in it can become markup), folded turns between a compaction heading and its end line."""
    lines = _header_lines(iteration)
    write(f"# {md_inline(lines[0])}")
    write("")
    for line in lines[1:]:
        write(f"- {md_inline(line)}")
    for event in events:
        kind = event["event"]
        write("")
        if kind == "compaction":
            write(
                f"## Compaction {event['index']}, before round {event['before_round']}: "
                f"{event['folded_turns']} turn(s) folded"
            )
            write("")
            write(
                f"{event['tokens_before']} → {event['tokens_after']} tokens (estimated), "
                f"summarised by {md_inline(event.get('model') or 'the default model')}. "
                "The model read this summary instead of the turns below:"
            )
            write("")
            _md_block(write, str(event.get("summary") or ""))
        elif kind == "compaction_end":
            write(f"*End of the turns compaction {event['index']} folded.*")
        elif kind == "compaction_failed":
            write(
                f"**Compaction {event['index']} tried before round {event['before_round']} "
                f"changed nothing:** {md_inline(str(event['error']))}"
            )
        elif kind in ("round", "unanswered_round"):
            resumed = event.get("resumed_by")
            if resumed:
                write(
                    f"*Attempt {resumed['attempt']} (worker {md_inline(str(resumed['worker_id']))}"
                    ") resumed the run here.*"
                )
                write("")
            folded = event.get("folded_by")
            note = f" (folded by compaction {folded})" if folded else ""
            note += " (no answer)" if kind == "unanswered_round" else ""
            write(f"### Round {event['round']}{note}")
            for reminder in event.get("reminders") or []:
                write("")
                write(
                    f"> **reminder ({md_inline(str(reminder['producer']))})**: "
                    f"{md_inline(str(reminder['text']))}"
                )
        elif kind == "message":
            message = event["message"]
            role = message.get("role")
            if message.get("content") is not None:
                if role == "tool":
                    write(f"**tool result** (call {md_inline(str(message.get('tool_call_id')))}):")
                else:
                    write(f"**{role}**:")
                write("")
                _md_block(write, str(message["content"]))
            for call in event.get("calls") or []:
                write(
                    f"- calls {md_inline(str(call['name']))} (id {md_inline(str(call['id']))})"
                    f"{md_inline(_call_suffix(call))}:"
                )
                write("")
                _md_block(write, _arguments_text(call), indent="  ")


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")


def md_inline(text: str) -> str:
    """``text`` as literal Markdown inline text: on one line, markup characters escaped."""
    return _MD_SPECIAL.sub(r"\\\1", visible(text).replace("\n", " "))


def _md_block(write: Callable[[str], None], text: str, indent: str = "") -> None:
    """``text`` in a fenced code block whose fence is longer than any backtick run in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    write(f"{indent}{fence}text")
    for line in visible(text).split("\n"):
        write(f"{indent}{line}")
    write(f"{indent}{fence}")


def message_label(message: Row) -> str:
    """``[role]``, ``[tool <call id>]`` or ``[assistant via <endpoint>, finish_reason …]``."""
    parts = [str(message.get("role"))]
    if message.get("tool_call_id"):
        parts.append(str(message["tool_call_id"]))
    info = message.get("reply_info")
    info = info if isinstance(info, dict) else {}
    if info.get("endpoint"):
        parts.append(f"via {info['endpoint']}")
    label = " ".join(parts)
    if info.get("finish_reason") not in (None, "stop", "tool_calls"):
        label += f", finish_reason {info['finish_reason']}"
    return f"[{label}]"


def replay_document(iteration: StoredIteration) -> Row:
    """``replay --format json`` and the API's replay: ``{"iteration": the row without its log
    and calls (its compactions without their folded messages, its approvals), "events":
    replay_events(iteration)}``. Raises ReplayError as ``replay_events`` does."""
    events = replay_events(iteration)
    header: Row = {k: v for k, v in iteration.items() if k not in ("messages", "tool_invocations")}
    header["compactions"] = [
        {k: v for k, v in c.items() if k != "folded"} for c in iteration.get("compactions") or []
    ]
    return {"iteration": header, "events": events}
