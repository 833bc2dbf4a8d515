"""What one run did so far, in the form it is stored: the message log, the tool invocations
and the reminders sent.

The loop's callbacks fill a ``Transcript`` as the run goes, so that an interrupted or crashed
run stores what it did (its tool calls already happened). Values are made storable here:
``json_safe`` turns anything into JSON that PostgreSQL accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from planner import ChatMessage, ExecutedCall, messages_to_json
from reminders import ReminderComposer
from worker.db.stores import ToolInvocationRow

__all__ = ["Transcript", "call_outcome", "json_safe"]


@dataclass
class Transcript:
    """A run's record so far.

    Attributes:
        attempt: the iteration's attempt number (stored on each invocation).
        policy_mode: the policy mode the run's calls are decided in (``off`` without a gate).
        messages: the stored message log so far (no reminders, ever).
        calls: executed calls so far, as they finished.
        reminders: the run's reminder channel, whose audit is stored (``None``: none).
    """

    attempt: int
    policy_mode: str
    messages: list[ChatMessage] = field(default_factory=list)
    calls: list[ExecutedCall] = field(default_factory=list)
    reminders: ReminderComposer | None = None

    def messages_json(self) -> list[dict[str, Any]]:
        """The message log as stored."""
        return list(json_safe(messages_to_json(self.messages)))

    def invocation_rows(self) -> list[ToolInvocationRow]:
        """Every executed call so far as a ``tool_invocations`` row, in source order (round,
        then position in the round): concurrent reads finish in any order, the stored story
        reads as the model wrote it."""
        ordered = sorted(self.calls, key=lambda c: (c.round, c.index))
        return [self.invocation_row(c) for c in ordered]

    def reminders_json(self) -> list[dict[str, Any]]:
        """The reminders sent so far: ``[{"round", "producer", "text"}]``."""
        return list(json_safe(self.reminders.audit())) if self.reminders is not None else []

    def invocation_row(self, call: ExecutedCall) -> ToolInvocationRow:
        """``call`` as a ``tool_invocations`` row, with its policy decision and mode."""
        decision = call.decision
        return ToolInvocationRow(
            attempt=self.attempt,
            round=call.round,
            call_id=call.call.id,
            tool=call.call.name,
            arguments=json_safe(call.call.arguments),
            result=json_safe(call.result) if call.ok else None,
            error=json_safe(call.error),
            outcome=call_outcome(call),
            duration_ms=call.duration_ms,
            policy_decision=json_safe(decision.model_dump(mode="json")) if decision else None,
            policy_mode=(decision.mode if decision and decision.mode else self.policy_mode),
        )


def call_outcome(call: ExecutedCall) -> str:
    """``denied`` (refused by the gate), ``ok`` or ``error``."""
    if call.decision is not None and not call.decision.allow:
        return "denied"
    return "ok" if call.ok else "error"


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data that PostgreSQL can store: non-JSON values stringified,
    NUL characters (which neither ``text`` nor ``jsonb`` accept) replaced by U+FFFD, and a
    value nested too deeply to encode replaced by a note saying so."""
    try:
        return _without_nul(json.loads(json.dumps(value, default=str)))
    except RecursionError:
        return "(not stored: nested too deeply to encode as JSON)"


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    return value
