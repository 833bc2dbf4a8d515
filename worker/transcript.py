"""What one run did so far, in the form it is stored: the message log, the tool invocations
and the reminders sent.

The loop's callbacks fill a ``Transcript`` as the run goes, so that an interrupted or crashed
run stores what it did (its tool calls already happened). Values are made storable here:
``json_safe`` turns anything into JSON that PostgreSQL accepts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import ChatMessage, ExecutedCall, messages_to_json
from reminders import ReminderComposer
from worker.db.stores import ToolInvocationRow

__all__ = ["Transcript", "call_outcome", "invocation_row", "json_safe", "messages_json"]


@dataclass
class Transcript:
    """A run's record so far.

    Attributes:
        attempt: the iteration's attempt number (stored on each invocation).
        policy_mode: the policy mode the run's calls are decided in (``off`` without a gate).
        messages: the stored message log so far (no reminders, ever).
        calls: executed calls so far, as they finished.
        reminders: the run's reminder channel, whose audit is stored (``None``: none).
        tool_names: the tools the run offered the model.
        source_problems: what the run's tool sources (MCP servers) left out, and why.
    """

    attempt: int
    policy_mode: str
    messages: list[ChatMessage] = field(default_factory=list)
    calls: list[ExecutedCall] = field(default_factory=list)
    reminders: ReminderComposer | None = None
    tool_names: frozenset[str] = frozenset()
    source_problems: list[str] = field(default_factory=list)

    def messages_json(self) -> list[dict[str, Any]]:
        """The message log as stored (see ``messages_json``)."""
        return messages_json(self.messages)

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
        return invocation_row(call, attempt=self.attempt, policy_mode=self.policy_mode)


def invocation_row(call: ExecutedCall, *, attempt: int, policy_mode: str) -> ToolInvocationRow:
    """``call`` as a ``tool_invocations`` row of any consumer: its arguments, result or error,
    outcome and duration, its policy decision, and the mode it was decided in (``policy_mode``
    when it carries none: ``off``, or a call that never reached the gate)."""
    decision = call.decision
    return ToolInvocationRow(
        attempt=attempt,
        round=call.round,
        call_id=json_safe(call.call.id),
        tool=json_safe(call.call.name),
        arguments=json_safe(call.call.arguments),
        result=json_safe(call.result) if call.ok else None,
        error=json_safe(call.error),
        outcome=call_outcome(call),
        duration_ms=call.duration_ms,
        policy_decision=json_safe(decision.model_dump(mode="json")) if decision else None,
        policy_mode=(decision.mode if decision and decision.mode else policy_mode),
    )


def messages_json(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` in the stored format, made storable by ``json_safe``. A message that cannot
    be encoded at all is stored as its role with a note saying why, so the rest of the log is
    kept."""
    try:
        return list(json_safe(messages_to_json(messages)))
    except Exception:  # find the message(s) at fault
        stored: list[dict[str, Any]] = []
        for message in messages:
            try:
                stored.append(json_safe(message.to_json()))
            except Exception as exc:
                note = f"(not stored: this message could not be encoded: {type(exc).__name__})"
                stored.append({"role": message.role, "content": note})
        return stored


def call_outcome(call: ExecutedCall) -> str:
    """``denied`` (refused by the gate), ``ok`` or ``error``."""
    if call.decision is not None and not call.decision.allow:
        return "denied"
    return "ok" if call.ok else "error"


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data that PostgreSQL can store: non-JSON values stringified,
    characters that neither ``text`` nor ``jsonb`` accept (NUL, lone UTF-16 surrogates)
    replaced by U+FFFD, and a value that cannot be encoded (nested too deeply, circular)
    replaced by a note saying so. Never raises."""
    try:
        return _storable(json.loads(json.dumps(value, default=str)))
    except (RecursionError, ValueError, TypeError) as exc:
        return f"(not stored: cannot be encoded as JSON: {type(exc).__name__})"


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value
