"""What one run did so far, in the form it is stored: the message log, the tool invocations
and the reminders sent.

The loop's callbacks fill a ``Transcript`` as the run goes, so that an interrupted or crashed
run stores what it did (its tool calls already happened). Values are made storable here:
``json_safe`` turns anything into JSON that PostgreSQL accepts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import (
    ChatMessage,
    Compaction,
    CompactionError,
    ExecutedCall,
    PolicyDecision,
    TokenUsage,
    ToolCall,
    messages_to_json,
)
from reminders import ReminderComposer
from worker.db.stores import ArchiveRow, RoundCheckpoint, ToolInvocationRow

__all__ = [
    "Transcript",
    "call_outcome",
    "invocation_row",
    "json_safe",
    "log_rounds",
    "log_usage",
    "messages_json",
]


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
        stored: ``(round, position) -> row id`` of the calls whose ``tool_invocations`` row
            exists (journaled writes, committed rounds, an earlier attempt's calls).
        current: the stored rows whose outcome is up to date (nothing to write for them).
        settled_earlier: calls of a resumed round that an earlier attempt finished.
        archive_pending: compactions of the log not stored yet (they go with the next write
            of the log).
        compactions: compactions of this iteration so far (earlier attempts' included).
        archived: archive rows of this iteration so far: compactions and failed attempts
            (their ``compaction_index`` counts on from it).
        hidden_rounds, hidden_usage: rounds whose replies are no longer in ``messages``
            (compaction folded them) and their tokens, plus what summarisations cost: the
            counts ``rounds()`` and ``usage()`` add to what the log shows.
        source_problems: what the run's tool sources (MCP servers) left out, and why.
    """

    attempt: int
    policy_mode: str
    messages: list[ChatMessage] = field(default_factory=list)
    calls: list[ExecutedCall] = field(default_factory=list)
    reminders: ReminderComposer | None = None
    tool_names: frozenset[str] = frozenset()
    stored: dict[tuple[int, int], int] = field(default_factory=dict)
    current: set[tuple[int, int]] = field(default_factory=set)
    settled_earlier: set[tuple[int, int]] = field(default_factory=set)
    archive_pending: list[ArchiveRow] = field(default_factory=list)
    compactions: int = 0
    archived: int = 0
    hidden_rounds: int = 0
    hidden_usage: TokenUsage = field(default_factory=TokenUsage)
    source_problems: list[str] = field(default_factory=list)

    def messages_json(self) -> list[dict[str, Any]]:
        """The message log as stored (see ``messages_json``)."""
        return messages_json(self.messages)

    def usage(self) -> TokenUsage:
        """Tokens of the run so far: each reply's ``reply_info.usage`` in the log (earlier
        attempts' rounds included), plus ``hidden_usage`` (folded rounds, summarisations)."""
        return self.hidden_usage + log_usage(self.messages)

    def rounds(self) -> int:
        """Rounds of the run so far: one per assistant reply in the log, plus the folded
        ones (``hidden_rounds``)."""
        return self.hidden_rounds + log_rounds(self.messages)

    def checkpoint(self) -> RoundCheckpoint:
        """What a round commit stores on the iteration row."""
        usage = self.usage()
        return RoundCheckpoint(
            messages=self.messages_json(),
            rounds=self.rounds(),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            reminders=self.reminders_json(),
            archive=tuple(self.archive_pending),
        )

    def compacted(self, round_no: int, compaction: Compaction) -> ArchiveRow:
        """The log was compacted before ``round_no``: take the new log, and keep what was
        folded for the archive (written with the next write of the log)."""
        self.messages[:] = compaction.messages
        self.compactions += 1
        self.archived += 1
        self.hidden_rounds += log_rounds(compaction.folded)
        self.hidden_usage = self.hidden_usage + log_usage(compaction.folded) + compaction.usage
        row = ArchiveRow(
            compaction_index=self.archived,
            round=round_no,
            start_index=compaction.start,
            folded=messages_json(compaction.folded),
            folded_turns=compaction.folded_turns,
            summary=json_safe(compaction.summary),
            tokens_before=compaction.tokens_before,
            tokens_after=compaction.tokens_after,
            model=compaction.model,
            duration_ms=compaction.duration_ms,
            attempt=self.attempt,
        )
        self.archive_pending.append(row)
        return row

    def compaction_failed(
        self, round_no: int, error: CompactionError, model: str | None
    ) -> ArchiveRow | None:
        """A compaction before ``round_no`` was tried and changed nothing: keep the attempt
        for the archive (with its error), unless no summariser was asked (``nothing_to_fold``:
        nothing to replay)."""
        self.hidden_usage = self.hidden_usage + error.usage
        if error.reason == "nothing_to_fold":
            return None
        self.archived += 1
        row = ArchiveRow(
            compaction_index=self.archived,
            round=round_no,
            start_index=0,
            folded=[],
            folded_turns=0,
            summary="",
            tokens_before=error.tokens_before,
            tokens_after=error.tokens_before,
            model=model,
            duration_ms=error.duration_ms,
            attempt=self.attempt,
            error=json_safe(f"{error.reason}: {error}"),
        )
        self.archive_pending.append(row)
        return row

    def archive_written(self, rows: Sequence[ArchiveRow]) -> None:
        """``rows`` were stored with the log."""
        written = set(id(r) for r in rows)
        self.archive_pending = [r for r in self.archive_pending if id(r) not in written]

    def invocation_rows(self) -> list[ToolInvocationRow]:
        """The ``tool_invocations`` rows still to write, in source order (round, then position
        in the round: concurrent reads finish in any order, the stored story reads as the model
        wrote it): new calls to insert, and stored rows whose outcome changed to update."""
        ordered = sorted(self.calls, key=lambda c: (c.round, c.index))
        return [self.invocation_row(c) for c in ordered if (c.round, c.index) not in self.current]

    def mark_written(self, rows: Sequence[ToolInvocationRow], new_ids: Sequence[int]) -> None:
        """``rows`` were written; the new ones (no ``row_id``) got ``new_ids``, in order."""
        fresh = iter(new_ids)
        for row in rows:
            key = (row.round, row.position)
            self.stored[key] = row.row_id if row.row_id is not None else next(fresh)
            self.current.add(key)

    def started_row(
        self,
        call: ToolCall,
        round: int,
        position: int,
        key: str | None,
        decision: PolicyDecision | None,
    ) -> ToolInvocationRow:
        """The ``started`` row of a write or destructive call about to run."""
        return ToolInvocationRow(
            attempt=self.attempt,
            round=round,
            position=position,
            call_id=json_safe(call.id),
            tool=json_safe(call.name),
            arguments=_arguments(call),
            result=None,
            error=None,
            outcome="started",
            duration_ms=0.0,
            policy_decision=json_safe(decision.model_dump(mode="json")) if decision else None,
            policy_mode=(decision.mode if decision and decision.mode else self.policy_mode),
            idempotency_key=key,
        )

    def reminders_json(self) -> list[dict[str, Any]]:
        """The reminders sent so far: ``[{"round", "producer", "text"}]``."""
        return list(json_safe(self.reminders.audit())) if self.reminders is not None else []

    def invocation_row(self, call: ExecutedCall) -> ToolInvocationRow:
        """``call`` as a ``tool_invocations`` row, with its policy decision and mode."""
        return invocation_row(
            call,
            attempt=self.attempt,
            policy_mode=self.policy_mode,
            row_id=self.stored.get((call.round, call.index)),
        )


def invocation_row(
    call: ExecutedCall, *, attempt: int, policy_mode: str, row_id: int | None = None
) -> ToolInvocationRow:
    """``call`` as a ``tool_invocations`` row of any consumer: its position, arguments, result
    or error, outcome and duration, its policy decision, and the mode it was decided in
    (``policy_mode`` when it carries none: ``off``, or a call that never reached the gate);
    ``row_id``: the stored row to update, if it exists."""
    decision = call.decision
    return ToolInvocationRow(
        attempt=attempt,
        round=call.round,
        position=call.index,
        row_id=row_id,
        call_id=json_safe(call.call.id),
        tool=json_safe(call.call.name),
        arguments=_arguments(call.call),
        result=json_safe(call.result) if call.ok else None,
        error=json_safe(call.error),
        outcome=call_outcome(call),
        duration_ms=call.duration_ms,
        policy_decision=json_safe(decision.model_dump(mode="json")) if decision else None,
        policy_mode=(decision.mode if decision and decision.mode else policy_mode),
    )


def log_rounds(messages: Sequence[ChatMessage]) -> int:
    """Rounds answered in ``messages``: one per assistant reply."""
    return sum(1 for m in messages if m.role == "assistant")


def log_usage(messages: Sequence[ChatMessage]) -> TokenUsage:
    """The tokens the replies in ``messages`` cost (their ``reply_info.usage``)."""
    total = TokenUsage()
    for message in messages:
        if message.reply_info is not None and message.reply_info.usage is not None:
            total = total + message.reply_info.usage
    return total


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


def _arguments(call: ToolCall) -> Any:
    """The arguments as stored: the decoded object, or the model's text when it could not be
    decoded (``{"raw_arguments": …}``), so the record shows what the model sent."""
    if call.raw_arguments is not None and not call.arguments:
        return {"raw_arguments": json_safe(call.raw_arguments)}
    return json_safe(call.arguments)


def call_outcome(call: ExecutedCall) -> str:
    """``unknown`` (in flight when its worker stopped), ``denied`` (refused by the gate),
    ``ok`` or ``error``."""
    if call.outcome_unknown:
        return "unknown"
    if call.decision is not None and not call.decision.allow:
        return "denied"
    return "ok" if call.ok else "error"


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data that PostgreSQL can store: non-JSON values stringified,
    characters that neither ``text`` nor ``jsonb`` accept (NUL, lone UTF-16 surrogates)
    replaced by U+FFFD, NaN and infinities stored as text, and a value that cannot be
    encoded (nested too deeply, circular) replaced by a note saying so. Never raises."""
    try:
        return _storable(json.loads(json.dumps(value, default=str)))
    except (RecursionError, ValueError, TypeError) as exc:
        return f"(not stored: cannot be encoded as JSON: {type(exc).__name__})"


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and infinities are not JSON; jsonb refuses them
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value
