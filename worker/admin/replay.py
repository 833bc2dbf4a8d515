"""``mana-ai replay``: a stored iteration as the whole conversation, the turns compaction folded
restored in place from the ``compacted_turns`` archive.

``replay_events`` turns one iteration (``AdminStore.get_iteration``) into a list of events in
reading order; ``render_text`` and ``render_markdown`` (``worker.admin.replay_render``) print
them; ``--format json`` prints them as they are. Events (``"event"`` key):

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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.errors import ManaAIError
from worker.queries.stored import (
    StoredApproval,
    StoredAttempt,
    StoredCompaction,
    StoredInvocation,
    StoredIteration,
)

__all__ = [
    "ReplayError",
    "checked_iteration",
    "is_summary",
    "later_attempt_last",
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
    items = _restore(iteration.get("messages") or [], iteration.get("compactions") or [])
    marks = _RoundMarks.of(iteration)
    events: list[Row] = []
    round_no = 0
    for item in items:
        message = item.message
        folded_by = item.folded_by[0] if item.folded_by else None
        events.extend(item.before)
        if message.get("role") == "assistant":
            round_no += 1
            events.extend(marks.round_opening(round_no, folded_by))
        event: Row = {
            "event": "message",
            "round": round_no,
            "folded_by": folded_by,
            "message": message,
        }
        if message.get("role") == "assistant" and message.get("tool_calls"):
            event["calls"] = marks.calls(round_no, message["tool_calls"])
        events.append(event)
        events.extend(item.after)
    return [*events, *marks.leftover()]


@dataclass
class _RoundMarks:
    """What the iteration's other records say about each round, keyed by round (and
    position): reminders, failed compactions, takeovers, tool invocations, approvals. The
    reminders and failed compactions are taken out as their rounds are reached."""

    reminders: dict[int, list[Row]]
    failed: dict[int, list[Row]]
    resumed: dict[int, Row]
    invocations: dict[tuple[int, int], StoredInvocation]
    approvals: dict[tuple[int, int], StoredApproval]

    @classmethod
    def of(cls, iteration: StoredIteration) -> _RoundMarks:
        """The marks of ``iteration``, grouped by round."""
        invocations: dict[tuple[int, int], StoredInvocation] = {}
        for inv in sorted(iteration.get("tool_invocations") or [], key=later_attempt_last):
            invocations[(int(inv["round"]), int(inv.get("position") or 0))] = inv
        return cls(
            reminders=_reminders_by_round(iteration),
            failed=_failed_compactions_by_round(iteration),
            resumed=_takeovers_by_round(iteration),
            invocations=invocations,
            approvals={
                (int(a["round"] or 0), int(a["position"] or 0)): a
                for a in iteration.get("approvals") or []
            },
        )

    def round_opening(self, round_no: int, folded_by: int | None) -> list[Row]:
        """The failed compactions tried before ``round_no``, then its ``round`` event."""
        return [
            *self.failed.pop(round_no, []),
            {
                "event": "round",
                "round": round_no,
                "folded_by": folded_by,
                "reminders": self.reminders.pop(round_no, []),
                "resumed_by": self.resumed.pop(round_no, None),
            },
        ]

    def calls(self, round_no: int, tool_calls: Sequence[Row]) -> list[Row]:
        """Each of a round's tool calls with its invocation and approval."""
        return [
            _call(
                call,
                self.invocations.get((round_no, position)),
                self.approvals.get((round_no, position)),
            )
            for position, call in enumerate(tool_calls)
        ]

    def leftover(self) -> list[Row]:
        """The marks of rounds that got no answer: failed compactions, unanswered rounds."""
        events: list[Row] = []
        for round_left in sorted(set(self.failed) | set(self.reminders)):
            events.extend(self.failed.pop(round_left, []))
            if round_left in self.reminders:
                events.append(
                    {
                        "event": "unanswered_round",
                        "round": round_left,
                        "reminders": self.reminders.pop(round_left),
                    }
                )
        return events


def _reminders_by_round(iteration: StoredIteration) -> dict[int, list[Row]]:
    """The reminder audit as ``{round: [{producer, text}]}``."""
    reminders: dict[int, list[Row]] = {}
    for reminder in iteration.get("reminders") or []:
        entry = {"producer": reminder.get("producer"), "text": reminder.get("text")}
        reminders.setdefault(int(reminder.get("round", 0)), []).append(entry)
    return reminders


def _failed_compactions_by_round(iteration: StoredIteration) -> dict[int, list[Row]]:
    """The compactions that failed, as ``compaction_failed`` events by the round they preceded."""
    failed: dict[int, list[Row]] = {}
    for row in iteration.get("compactions") or []:
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
    return failed


def _takeovers_by_round(iteration: StoredIteration) -> dict[int, Row]:
    """The attempts that resumed the run, by the first round they ran."""
    resumed: dict[int, Row] = {}
    for attempt in iteration.get("attempts") or []:
        after = attempt.get("resumed_after_round")
        if after:
            resumed[int(after) + 1] = {
                "attempt": attempt.get("attempt"),
                "worker_id": attempt.get("worker_id"),
                "after_approval": after_approval(attempt),
            }
    return resumed


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
