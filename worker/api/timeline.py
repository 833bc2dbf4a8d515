"""An iteration as the console's timeline: the replay's events (``worker.admin.replay``) made
into nested blocks a template draws.

* the head: the system prompt and the objective (and any prior messages);
* a ``round`` per request: the reminders sent with it (chips), the reply's text, its calls in
  the model's order, each with its arguments, policy decision, approval, duration, outcome
  and result, consecutive read calls grouped (``parallel``: they ran side by side);
* a ``compaction`` holding the rounds it folded and the summary the model read instead
  (nested when a later compaction folded an earlier summary); ``compaction_failed`` where one
  was tried and changed nothing.

A long iteration is drawn a page of rounds at a time (``rounds_page``: ``ROUNDS_PER_PAGE``
rounds by number, the head on the first page, a compaction on every page that holds one of the
rounds it folded).

Pure: no I/O; the policy hints of the tools come from the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import ceil
from typing import Any

from worker.admin.replay_render import approval_text, policy_text

__all__ = ["ROUNDS_PER_PAGE", "page_of_round", "rounds_page", "timeline"]

Row = dict[str, Any]

ROUNDS_PER_PAGE = 20
"""Rounds an iteration's page shows at most (200 rounds drew 2.1 MiB of HTML on one page)."""

_ROUND_EVENTS = ("round", "unanswered_round", "message")


def page_of_round(round_no: Any, size: int = ROUNDS_PER_PAGE) -> int:
    """The page (1-based) that shows round ``round_no`` (anything but a round number: 1)."""
    return (round_no - 1) // size + 1 if isinstance(round_no, int) and round_no > 0 else 1


def rounds_page(
    events: Sequence[Row], page: int, size: int = ROUNDS_PER_PAGE
) -> tuple[list[Row], int]:
    """The events of ``page`` (1-based) of ``events`` (``replay_events``), ``size`` rounds a
    page, and how many pages there are (at least 1). A page keeps the events of its rounds
    (rounds ``(page - 1) * size + 1`` to ``page * size``), the head (round 0) on page 1, and a
    compaction's opening and end when it folded one of its rounds (or, folding none, stands
    before one of them). A page past the last one holds nothing."""
    last_round = max((_round(e) for e in events if e["event"] in _ROUND_EVENTS), default=0)
    pages = max(1, ceil(last_round / size))
    first, last = (page - 1) * size + 1, page * size
    spans = _compaction_spans(events)
    kept: list[Row] = []
    for index, event in enumerate(events):
        if index in spans:
            low, high = spans[index]
            keep = low <= last and high >= first
        else:
            number = _round(event) if event["event"] in _ROUND_EVENTS else _at_round(event)
            keep = first <= number <= last or (number == 0 and page == 1)
        if keep:
            kept.append(event)
    return kept, pages


def _round(event: Row) -> int:
    number = event.get("round")
    return number if isinstance(number, int) else 0


def _at_round(event: Row) -> int:
    """The round an event that belongs to no round stands before (a failed compaction)."""
    number = event.get("before_round")
    return number if isinstance(number, int) else _round(event)


def _compaction_spans(events: Sequence[Row]) -> dict[int, tuple[int, int]]:
    """For the index of each compaction's opening and end: the lowest and highest round it
    folded (with none: the round it stands before)."""
    spans: dict[int, tuple[int, int]] = {}
    open_: list[list[int]] = []  # [opening index, low, high, stands before]
    for index, event in enumerate(events):
        kind = event["event"]
        if kind == "compaction":
            open_.append([index, 1 << 62, -1, _at_round(event)])
        elif kind == "compaction_end" and open_:
            start, low, high, before = open_.pop()
            span = (low, high) if high >= 0 else (before, before)
            spans[start] = spans[index] = span
        elif kind in _ROUND_EVENTS and _round(event) > 0:
            for frame in open_:
                frame[1] = min(frame[1], _round(event))
                frame[2] = max(frame[2], _round(event))
    for start, low, high, before in open_:  # never ended: spans to the last round
        spans[start] = (low, high) if high >= 0 else (before, before)
    return spans


def timeline(events: Sequence[Row], hints: Mapping[str, str]) -> list[Row]:
    """The blocks of ``events`` (``replay_events``), tools' policy hints by name ``hints``
    (``read`` | ``write`` | ``destructive``; a tool not named counts as not a read)."""
    root: list[Row] = []
    stack: list[list[Row]] = [root]
    results: dict[str, Row] = {}
    rounds: list[Row] = []
    for event in events:
        kind = event["event"]
        here = stack[-1]
        if kind == "compaction":
            block = {"kind": "compaction", **event, "children": []}
            here.append(block)
            stack.append(block["children"])
        elif kind == "compaction_end":
            if len(stack) > 1:
                stack.pop()
        elif kind == "compaction_failed":
            here.append({"kind": "compaction_failed", **event})
        elif kind in ("round", "unanswered_round"):
            block = {
                "kind": "round",
                "round": event["round"],
                "answered": kind == "round",
                "reminders": event.get("reminders") or [],
                "resumed_by": event.get("resumed_by"),
                "reply": None,
                "groups": [],
                "others": [],
            }
            here.append(block)
            rounds.append(block)
        elif kind == "message":
            message = event["message"]
            role = message.get("role")
            current = rounds[-1] if rounds and event.get("round") else None
            if role == "assistant" and current is not None:
                current["reply"] = message
                current["groups"] = _groups(event.get("calls") or [], hints)
            elif role == "tool":
                call_id = str(message.get("tool_call_id"))
                results[call_id] = message
                if current is not None and not _attached(current, call_id):
                    current["others"].append(message)
            elif current is not None:
                current["others"].append(message)  # a note the loop added (a cut reply)
            else:
                here.append({"kind": "message", "message": message})
    for block in rounds:
        for group in block["groups"]:
            for call in group["calls"]:
                result = results.get(str(call.get("id")))
                call["result"] = None if result is None else result.get("content")
    return root


def _attached(block: Row, call_id: str) -> bool:
    return any(str(c.get("id")) == call_id for g in block["groups"] for c in g["calls"])


def _groups(calls: Sequence[Row], hints: Mapping[str, str]) -> list[Row]:
    """The calls in runs: consecutive reads form one group (``parallel`` when two or more:
    they ran side by side); every other call is a group of its own."""
    groups: list[Row] = []
    for call in calls:
        entry = dict(call)
        entry["hint"] = hints.get(str(call.get("name")))
        entry["policy"] = policy_text(call.get("policy_decision"), call.get("policy_mode"))
        entry["approval_text"] = approval_text(call["approval"]) if call.get("approval") else None
        verdict = (call.get("policy_decision") or {}).get("verdict")
        entry["tone"] = _tone(call.get("outcome"), verdict)
        if entry["hint"] == "read" and groups and groups[-1]["reads"]:
            groups[-1]["calls"].append(entry)
        else:
            groups.append({"reads": entry["hint"] == "read", "calls": [entry]})
    for group in groups:
        group["parallel"] = group["reads"] and len(group["calls"]) > 1
    return groups


def _tone(outcome: Any, verdict: Any) -> str:
    """How a call is shown: ``ok``, ``error``, ``denied``, ``waiting`` (parked), ``unknown``."""
    if outcome == "parked" or (verdict == "ask" and outcome is None):
        return "waiting"
    if outcome in ("ok", "error", "denied", "unknown"):
        return str(outcome)
    return "unknown"
