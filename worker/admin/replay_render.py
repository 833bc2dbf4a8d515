"""Replay's rendering: the events of ``worker.admin.replay.replay_events`` printed as plain
text (``render_text``) or Markdown (``render_markdown``), and the one-line texts the console
and the CLI share (``policy_text``, ``approval_text``, ``message_label``, ``md_inline``).

Every text that came from a model, a tool or a prompt goes through
``worker.terminal_text.visible``: control and invisible characters are shown as escapes,
never sent to the terminal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from worker.queries.stored import StoredIteration, decided_text
from worker.terminal_text import visible

__all__ = [
    "approval_text",
    "md_inline",
    "message_label",
    "policy_text",
    "render_markdown",
    "render_text",
]

Row = dict[str, Any]
Write = Callable[[str], None]


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
    """A call's arguments as JSON, or its undecodable raw text."""
    if call.get("raw_arguments") is not None:
        return f"<undecodable: {call['raw_arguments']!r}>"
    return json.dumps(call.get("arguments", {}), ensure_ascii=False)


def _call_suffix(call: Row) -> str:
    """`` [outcome; policy …; approval …]`` after a call, or nothing."""
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
    """The iteration's summary: status and tokens, its error, its compactions."""
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


def render_text(iteration: StoredIteration, events: Sequence[Row], write: Write) -> None:
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
            _text_compaction(write, bar, event)
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
            _text_round(write, bar, event)
        elif kind == "message":
            _text_message(write, bar, event)


def _text_compaction(write: Write, bar: str, event: Row) -> None:
    """The line that opens a compaction's folded turns, and its summary quoted."""
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


def _text_round(write: Write, bar: str, event: Row) -> None:
    """A round's heading (after the takeover that resumed it, if any) and its reminders."""
    resumed = event.get("resumed_by")
    if resumed:
        _write_text(
            write,
            bar,
            f"== attempt {resumed['attempt']} (worker {resumed['worker_id']}) "
            "resumed the run here ==",
        )
    note = " (no answer)" if event["event"] == "unanswered_round" else ""
    write(f"{bar}-- round {event['round']}{note} --")
    for reminder in event.get("reminders") or []:
        _write_text(write, bar, f"[reminder {reminder['producer']}] {reminder['text']}")


def _text_message(write: Write, bar: str, event: Row) -> None:
    """A message's content, then one line per tool call it made."""
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


def _write_text(write: Write, bar: str, text: str) -> None:
    """``text`` line by line, each prefixed ``bar`` (the lines after the first indented)."""
    first, *rest = visible(str(text)).split("\n")
    write(f"{bar}{first}")
    for line in rest:
        write(f"{bar}    {line}")


def render_markdown(iteration: StoredIteration, events: Sequence[Row], write: Write) -> None:
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
            _md_compaction(write, event)
        elif kind == "compaction_end":
            write(f"*End of the turns compaction {event['index']} folded.*")
        elif kind == "compaction_failed":
            write(
                f"**Compaction {event['index']} tried before round {event['before_round']} "
                f"changed nothing:** {md_inline(str(event['error']))}"
            )
        elif kind in ("round", "unanswered_round"):
            _md_round(write, event)
        elif kind == "message":
            _md_message(write, event)


def _md_compaction(write: Write, event: Row) -> None:
    """A compaction's heading, its figures and its summary in a code block."""
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


def _md_round(write: Write, event: Row) -> None:
    """A round's heading (after the takeover that resumed it, if any) and its reminders."""
    resumed = event.get("resumed_by")
    if resumed:
        write(
            f"*Attempt {resumed['attempt']} (worker {md_inline(str(resumed['worker_id']))}"
            ") resumed the run here.*"
        )
        write("")
    folded = event.get("folded_by")
    note = f" (folded by compaction {folded})" if folded else ""
    note += " (no answer)" if event["event"] == "unanswered_round" else ""
    write(f"### Round {event['round']}{note}")
    for reminder in event.get("reminders") or []:
        write("")
        write(
            f"> **reminder ({md_inline(str(reminder['producer']))})**: "
            f"{md_inline(str(reminder['text']))}"
        )


def _md_message(write: Write, event: Row) -> None:
    """A message's content in a code block, then each tool call with its arguments."""
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


def _md_block(write: Write, text: str, indent: str = "") -> None:
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
