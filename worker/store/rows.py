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
import re
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
from planner.json_text import compact_encoder, storable_text
from planner.policy import PolicyDecision, PolicyMode
from worker import redaction
from worker.store.base import ArchiveRow, ToolInvocationRow
from worker.store.prepared import EncodedJSON
from worker.store.statuses import CallOutcome

__all__ = [
    "archive_row",
    "call_outcome",
    "encoded_json",
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
    kept. A log that is storable as it is comes as an ``EncodedJSON`` (its text made once:
    the statement that stores it sends that text, not a second encoding)."""
    try:
        data = messages_to_json(messages)
        text = _storable_text(data)
        if text is not None:
            # ``data`` is what decoding ``text`` gives: pydantic's JSON mode makes plain JSON
            # types only (tuples become lists, keys strings, NaN null), and the text has
            # nothing PostgreSQL would refuse
            return EncodedJSON(data, text)
        return list(json_safe(data))
    except Exception:  # find the message(s) at fault
        stored: list[dict[str, Any]] = []
        for message in messages:
            try:
                stored.append(json_safe(message.to_json()))
            except Exception as exc:
                note = f"(not stored: this message could not be encoded: {type(exc).__name__})"
                stored.append({"role": message.role, "content": note})
        return stored


def encoded_json(items: list[Any]) -> list[Any]:
    """``items`` (JSON data, as ``json_safe`` and the row builders here make it) as an
    ``EncodedJSON`` with its text made once by the C encoder; when it holds something that
    encoder does not write, PostgreSQL would refuse (NUL, a lone surrogate in a field no
    ``json_safe`` went over) or a secret, ``json_safe`` of it."""
    text = _storable_text(items)
    if text is None:
        items = json_safe(items)
        text = _storable_text(items)
    return items if text is None else EncodedJSON(items, text)


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
    characters that neither ``text`` nor ``jsonb`` accept (NUL, lone UTF-16 surrogates)
    replaced by U+FFFD, NaN and infinities stored as text, a value that cannot be encoded
    (nested too deeply, circular) replaced by a note saying so, and every secret of the
    process (``worker.redaction``: a key a peer echoed) replaced by ``***``. Every text a run
    stores goes through it. Never raises."""
    kind = type(value)
    if kind is dict or kind is list:  # a structure: encoded and decoded in C, checked once
        text = _storable_text(value)
        if text is not None:
            return _DECODE(text)
    try:
        return _plain_json(value)
    except (_NotPlain, RecursionError):
        pass  # not plain JSON data: through the encoder (same result, three times the work)
    try:
        return _storable(json.loads(json.dumps(value, default=str)))
    except Exception as exc:  # too deep, circular, or a __str__ that raises
        return f"(not stored: cannot be encoded as JSON: {type(exc).__name__})"


def _storable_text(value: Any) -> str | None:
    """``value``'s JSON text when ``value`` is plain JSON data that PostgreSQL stores as it
    is (no NaN or infinity, no NUL, no lone surrogate, no other type), else ``None``."""
    try:
        text = "".join(_ENCODER(value, 0)) if _ENCODER is not None else _ENCODE(value)
    except (ValueError, TypeError, RecursionError):
        return None  # NaN, a type JSON lacks, too deep: the walk or the encoder says
    # the encoder writes NUL as the escape \u0000 and a lone surrogate as it is (ASCII text
    # has none: the check of every character is made only for text that is not)
    if "\\u0000" in text or (not text.isascii() and _UNSTORABLE.search(text) is not None):
        return None
    if redaction.redactor().found(text):
        return None  # a secret a peer echoed: the walk masks it
    return text


class _NotPlain(Exception):
    """A value ``_plain_json`` leaves to the encoder."""


def _plain_json(value: Any) -> Any:
    """``json_safe`` of plain JSON data (``dict`` with ``str`` keys, ``list``, ``str``,
    ``int``, ``float``, ``bool``, ``None``, exactly those types) without encoding it: what the
    encoder's round trip would give. Raises ``_NotPlain`` for anything else (a tuple, an enum,
    a key that is not a string, another type), and RecursionError when nested too deeply."""
    kind = type(value)
    if kind is str:
        return _storable_str(value)
    if value is None or kind is int or kind is bool:
        return value
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if kind is dict:
        plain = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            plain[_storable_str(key)] = _plain_json(item)
        return plain
    if kind is list:
        return [_plain_json(item) for item in value]
    raise _NotPlain


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable_str(text: str) -> str:
    """``text`` with NUL and lone surrogates replaced by U+FFFD and the process's secrets by
    ``***`` (``worker.redaction``)."""
    return redaction.redact(storable_text(text))


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENCODER = compact_encoder(_not_json, allow_nan=False)
"""``"".join(_ENCODER(value, 0))``: plain JSON data (a ``dict`` or ``list``) as text,
``ValueError`` for NaN or an infinity, ``TypeError`` for another type; a structure that
contains itself raises ``RecursionError``."""
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False).encode
"""The same, where CPython's C encoder is missing."""
_DECODE = json.JSONDecoder().decode


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _storable_str(value)
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
