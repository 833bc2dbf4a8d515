"""A stored iteration as the admin commands read it back: typed rows for ``replay``,
``replay --rerun`` and ``iterations show``.

The rows are ``TypedDict``: the shape of the columns (``worker.db.tables``) as read by
``AdminStore.get_iteration``, with the iteration's calls and compactions attached. Every key is
optional (``total=False``) because replay also reads rows written by older releases (no
``reminders``, no ``attempts``, no ``position``) and the ``--json`` export of one; readers use
``.get`` with a default. JSON columns (``messages``, ``arguments``, ``result``,
``policy_decision``, ``folded``) hold what ``worker.store.rows`` wrote: plain JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import cache
from typing import Any, TypedDict

__all__ = [
    "StoredApproval",
    "StoredAttempt",
    "StoredCompaction",
    "StoredInvocation",
    "StoredIteration",
    "decided_text",
    "jsonable",
]


class StoredInvocation(TypedDict, total=False):
    """A ``tool_invocations`` row of an iteration: one call of one attempt (``round``
    1-based, ``position`` 0-based in its assistant message; ``outcome`` a ``CallOutcome``
    value; ``duration_ms`` milliseconds)."""

    id: int
    iteration_id: int | None
    mission_id: int | None
    user_id: str
    attempt: int
    round: int
    position: int
    call_id: str
    tool: str
    arguments: Any
    result: Any
    error: str | None
    outcome: str
    policy_decision: dict[str, Any] | None
    policy_mode: str | None
    idempotency_key: str | None
    duration_ms: float
    consumer: str
    created_at: datetime


class StoredCompaction(TypedDict, total=False):
    """A ``compacted_turns`` row: one compaction (or a failed attempt, with ``error``) before
    ``round``; ``folded`` the messages it replaced, verbatim; ``start_index`` where its summary
    sits in the log; tokens as the compactor counted them."""

    id: int
    iteration_id: int
    mission_id: int
    attempt: int
    compaction_index: int
    round: int
    start_index: int
    folded: list[dict[str, Any]]
    folded_turns: int
    summary: str
    tokens_before: int
    tokens_after: int
    model: str | None
    duration_ms: float
    error: str | None
    created_at: datetime


class StoredApproval(TypedDict, total=False):
    """An ``approval_requests`` row of an iteration: a call (``round``, ``position``) the gate
    asked a person about, and the decision (``status`` as it stands now: a pending request
    past ``expires_at`` reads ``expired``)."""

    id: int
    consumer: str
    status: str
    user_id: str
    iteration_id: int | None
    attempt: int | None
    round: int | None
    position: int | None
    call_id: str
    tool: str
    arguments: Any
    arguments_hash: str
    reply_text: str | None
    reason: str
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    decision_note: str | None


class StoredAttempt(TypedDict, total=False):
    """One attempt of an iteration (``mission_iterations.attempts``): who ran it, from when,
    after which round a takeover resumed it, and the status it resumed from
    (``resumed_from``: ``running`` when its worker died, ``failed`` when it was interrupted,
    ``awaiting_approval`` when it went on after a decision; absent on the first attempt, and on
    takeovers stored before it was recorded)."""

    attempt: int
    worker_id: str
    started_at: str
    resumed_after_round: int | None
    resumed_from: str


class StoredIteration(TypedDict, total=False):
    """A ``mission_iterations`` row (``status`` an ``IterationStatus`` value, ``stop_reason`` a
    ``StopReason`` or ``RunnerStopReason`` value; ``messages`` the stored log), with its calls
    in the model's order (``tool_invocations``), its compactions in the order they happened
    (``compactions``) and the approval requests of its calls, in the order they were asked
    (``approvals``)."""

    id: int
    mission_id: int
    scheduled_for: datetime
    status: str
    attempt: int
    messages: list[dict[str, Any]]
    reminders: list[dict[str, Any]]
    attempts: list[StoredAttempt]
    rounds: int
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str | None
    error: str | None
    worker_id: str
    model: str | None
    started_at: datetime
    finished_at: datetime | None
    tool_invocations: list[StoredInvocation]
    compactions: list[StoredCompaction]
    approvals: list[StoredApproval]


def decided_text(row: Mapping[str, Any], when: Callable[[Any], str] | None = None) -> str:
    """How a request stands, in words: ``pending until 2026-…``, ``approved by alice at …:
    note``, ``denied by bob at …: reason``, ``expired at … (nobody decided in time)``; times
    written by ``when`` (default: ISO 8601 to the second)."""
    at = when or _iso
    status = row.get("status")
    if status == "pending":
        return f"pending until {at(row.get('expires_at'))}"
    if status == "expired":
        moment = row.get("decided_at") or row.get("expires_at")
        note = row.get("decision_note") or "nobody decided in time"
        return f"expired at {at(moment)} ({note})"
    text_ = f"{status} by {row.get('decided_by') or 'someone'} at {at(row.get('decided_at'))}"
    return f"{text_}: {row['decision_note']}" if row.get("decision_note") else text_


def _iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value)


@cache
def _duration() -> Any:
    """pydantic's writer of durations, loaded on first use (``--help`` loads no pydantic)."""
    from pydantic import TypeAdapter

    return TypeAdapter(timedelta)


def jsonable(value: Any) -> Any:
    """``value`` (a stored row, or a value in one) with datetimes as ISO strings, durations as
    ISO 8601 durations (``PT6H``, as pydantic writes them) and tuples as lists: what
    ``json.dumps`` takes (``--json`` output, the HTTP API's bodies)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return _duration().dump_python(value, mode="json")
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
