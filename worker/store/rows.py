"""What a run's record becomes in storage: plain JSON that PostgreSQL accepts, the stored
message log, and the ``tool_invocations`` and ``compacted_turns`` rows of its calls and
compactions.

``json_safe`` makes anything storable (it never raises); ``messages_json`` is the stored log
format; ``invocation_row`` and ``archive_row`` are the rows of one call and one compaction,
whichever consumer made them (a mission, an MCP client).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from planner import (
    ApprovalRequested,
    ArchiveEntry,
    ChatMessage,
    ExecutedCall,
    ToolCall,
    messages_to_json,
)
from planner.json_text import storable_text
from planner.policy import PolicyDecision, PolicyMode
from worker import redaction
from worker.db.statuses import CallOutcome
from worker.store.records import ArchiveRow, ToolInvocationRow

__all__ = [
    "archive_row",
    "call_outcome",
    "invocation_row",
    "json_safe",
    "messages_json",
    "parked_row",
    "started_row",
]


def invocation_row(
    call: ExecutedCall, *, attempt: int, policy_mode: PolicyMode, row_id: int | None = None
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


def call_outcome(call: ExecutedCall) -> CallOutcome:
    """``unknown`` (in flight when its worker stopped), ``denied`` (refused by the gate),
    ``ok`` or ``error``."""
    if call.outcome_unknown:
        return CallOutcome.UNKNOWN
    if call.decision is not None and not call.decision.allow:
        return CallOutcome.DENIED
    return CallOutcome.OK if call.ok else CallOutcome.ERROR


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data that PostgreSQL can store: non-JSON values stringified,
    tuples as lists, characters that neither ``text`` nor ``jsonb`` accept (NUL, lone UTF-16
    surrogates) replaced by U+FFFD (``planner.json_text.storable_text``), NaN and infinities
    stored as text, a value that cannot be encoded (nested too deeply, circular) replaced by a
    note saying so, and every secret of the process (``worker.redaction``: a key a peer
    echoed) replaced by ``***``. Every text a run stores goes through it. Never raises."""
    try:
        plain = json.loads(json.dumps(value, default=str))
        return _storable(plain)
    except Exception as exc:  # too deep, circular, or a __str__ that raises
        return f"(not stored: cannot be encoded as JSON: {type(exc).__name__})"


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return redaction.redact(storable_text(value))
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and infinities are not JSON; jsonb refuses them
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    return value


def started_row(
    call: ToolCall,
    *,
    round: int,
    position: int,
    attempt: int,
    idempotency_key: str | None,
    policy_mode: PolicyMode,
    decision: PolicyDecision | None = None,
) -> ToolInvocationRow:
    """The ``started`` row of a write or destructive call about to run, with the gate's
    ``decision`` that lets it start when there is one (an approval, say: what a takeover that
    finds the call in flight reads); its outcome, and its decision as counted, come with its
    next write."""
    return ToolInvocationRow(
        attempt=attempt,
        round=round,
        position=position,
        call_id=json_safe(call.id),
        tool=json_safe(call.name),
        arguments=_arguments(call),
        result=None,
        error=None,
        outcome=CallOutcome.STARTED,
        duration_ms=0.0,
        policy_decision=json_safe(decision.model_dump(mode="json")) if decision else None,
        policy_mode=(decision.mode if decision and decision.mode else policy_mode),
        idempotency_key=idempotency_key,
    )


def parked_row(
    parked: ApprovalRequested,
    *,
    attempt: int,
    idempotency_key: str | None,
    policy_mode: PolicyMode,
) -> ToolInvocationRow:
    """The ``parked`` row of a call that waits for a person's approval: the call as it would
    run, with the gate's decision (verdict ``ask``) and the idempotency key it will run with."""
    decision = parked.decision
    return dataclasses.replace(
        started_row(
            parked.call,
            round=parked.round,
            position=parked.position,
            attempt=attempt,
            idempotency_key=idempotency_key,
            policy_mode=decision.mode or policy_mode,
        ),
        outcome=CallOutcome.PARKED,
        policy_decision=json_safe(decision.model_dump(mode="json")),
    )


def archive_row(entry: ArchiveEntry, *, attempt: int, model: str | None) -> ArchiveRow:
    """The ``compacted_turns`` row of one compaction (or failed attempt) of the record;
    ``model`` names the summariser of a failed attempt."""
    compaction, error = entry.compaction, entry.error
    if compaction is not None:
        return ArchiveRow(
            compaction_index=entry.index,
            round=entry.round,
            start_index=compaction.start,
            folded=messages_json(compaction.folded),
            folded_turns=compaction.folded_turns,
            summary=json_safe(compaction.summary),
            tokens_before=compaction.tokens_before,
            tokens_after=compaction.tokens_after,
            model=compaction.model,
            duration_ms=compaction.duration_ms,
            attempt=attempt,
        )
    assert error is not None
    return ArchiveRow(
        compaction_index=entry.index,
        round=entry.round,
        start_index=0,
        folded=[],
        folded_turns=0,
        summary="",
        tokens_before=error.tokens_before,
        tokens_after=error.tokens_before,
        model=model,
        duration_ms=error.duration_ms,
        attempt=attempt,
        error=json_safe(f"{error.reason}: {error}"),
    )
