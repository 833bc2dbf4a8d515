"""The bind parameters of a run's write statements (``worker.store.writes``), from the values
that cross the store seam (``worker.store.records``): every text and JSON value through
``worker.store.rows.json_safe`` (storable, and no secret of the process in it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import null
from sqlalchemy.sql.elements import Null

from worker.store.records import (
    ApprovalRequestRow,
    ArchiveRow,
    ClaimedMission,
    IterationOutcome,
    RoundCheckpoint,
    ToolInvocationRow,
)
from worker.store.rows import json_safe
from worker.store.writes.parts import APPROVAL_KEYS

__all__ = [
    "approval",
    "ended",
    "invocation_outcome_values",
    "new_ids",
    "progress",
    "schedule",
    "storable",
]


def progress(
    mission: ClaimedMission,
    iteration_id: int,
    checkpoint: RoundCheckpoint | None,
    rows: Sequence[ToolInvocationRow],
    *,
    worker_id: str,
) -> dict[str, Any]:
    """The parameters of a run's progress: the iteration, its checkpoint (``None``: all
    ``None``, the stored one stays), its calls not stored yet (``rows``: new ones to insert,
    journaled ones to update) and its compactions not stored yet."""
    new: list[dict[str, Any]] = []
    known: list[dict[str, Any]] = []
    for row in rows:
        if row.row_id is None:
            new.append(_plain(_invocation_values(mission, iteration_id, row)))
        else:
            known.append(_plain({"id": row.row_id, **invocation_outcome_values(row)}))
    archive = [] if checkpoint is None else checkpoint.archive
    return {
        "p_mission_id": mission.id,
        "p_worker_id": worker_id,
        "p_iteration_id": iteration_id,
        "p_messages": None if checkpoint is None else checkpoint.messages,
        "p_reminders": None if checkpoint is None else storable(checkpoint.reminders),
        "p_rounds": None if checkpoint is None else checkpoint.rounds,
        "p_prompt_tokens": None if checkpoint is None else checkpoint.prompt_tokens,
        "p_completion_tokens": None if checkpoint is None else checkpoint.completion_tokens,
        "p_new_calls": storable(new),
        "p_known_calls": storable(known),
        "p_archive": storable([_archive_values(mission, iteration_id, r) for r in archive]),
    }


def ended(attempt: int, status: str, stop_reason: str | None, error: str | None) -> dict[str, Any]:
    """The parameters of an iteration's end, by ``attempt``."""
    return {
        "p_attempt": attempt,
        "p_status": status,
        "p_stop_reason": stop_reason,
        "p_error": storable(error),
    }


def schedule(
    mission: ClaimedMission, outcome: IterationOutcome, *, worker_id: str
) -> dict[str, Any]:
    """The parameters of the mission's next run (``outcome``'s), its lease released."""
    return {
        "p_mission_id": mission.id,
        "p_worker_id": worker_id,
        "p_next_run_at": outcome.next_run_at,
        "p_mission_status": outcome.mission_status,
        "p_last_error": storable(outcome.error),
    }


def finished_checkpoint(outcome: IterationOutcome) -> RoundCheckpoint:
    """What a finished run stores on its iteration row, as a checkpoint (with its archive)."""
    return RoundCheckpoint(
        messages=outcome.messages,
        rounds=outcome.rounds,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        reminders=outcome.reminders,
        archive=outcome.archive,
    )


def approval(request: ApprovalRequestRow) -> dict[str, Any]:
    """The parameters of a parked call's approval request."""
    return {
        "p_ttl": request.ttl,
        **{f"p_{key}": storable(getattr(request, key)) for key in APPROVAL_KEYS},
    }


def new_ids(row: Mapping[Any, Any]) -> dict[tuple[int, int], int]:
    """The ids of the calls' rows a statement inserted or found, by ``(round, position)``
    (its ``calls``: ``[[round, position, id], ...]``)."""
    return {(int(r), int(p)): int(i) for r, p, i in row.get("calls") or ()}


def storable(value: Any) -> Any:
    """Text and JSON data through ``json_safe``; anything else (a number, a time, ``None``)
    as it is."""
    if isinstance(value, str | dict | list):
        return json_safe(value)
    return value


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """``null()`` (SQL NULL in a bind) as ``None``: in a recordset, JSON null is SQL NULL."""
    return {k: None if isinstance(v, Null) else v for k, v in values.items()}


def _archive_values(mission: ClaimedMission, iteration_id: int, row: ArchiveRow) -> dict[str, Any]:
    return {
        "iteration_id": iteration_id,
        "mission_id": mission.id,
        "attempt": row.attempt,
        "compaction_index": row.compaction_index,
        "round": row.round,
        "start_index": row.start_index,
        "folded": row.folded,
        "folded_turns": row.folded_turns,
        "summary": row.summary,
        "tokens_before": row.tokens_before,
        "tokens_after": row.tokens_after,
        "model": row.model,
        "duration_ms": row.duration_ms,
        "error": row.error,
    }


def invocation_outcome_values(row: ToolInvocationRow) -> dict[str, Any]:
    """The outcome columns of a ``tool_invocations`` row (result, error, outcome, policy
    decision and mode, duration), and its ``attempt`` (see ``parts.OUTCOME_KEYS``); a missing
    result or decision is SQL NULL."""
    return {
        "result": null() if row.result is None else row.result,
        "error": row.error,
        "outcome": row.outcome,
        # SQL NULL, not JSON null: "no decision" must read as such in reports
        "policy_decision": null() if row.policy_decision is None else row.policy_decision,
        "policy_mode": row.policy_mode,
        "duration_ms": row.duration_ms,
        "attempt": row.attempt,
    }


def _invocation_values(
    mission: ClaimedMission, iteration_id: int, row: ToolInvocationRow
) -> dict[str, Any]:
    return {
        "iteration_id": iteration_id,
        "mission_id": mission.id,
        "user_id": mission.owner_user_id,
        "attempt": row.attempt,
        "round": row.round,
        "position": row.position,
        "call_id": row.call_id,
        "tool": row.tool,
        "arguments": row.arguments,
        "idempotency_key": row.idempotency_key,
        **invocation_outcome_values(row),
    }
