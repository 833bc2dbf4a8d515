"""How a takeover goes on from what a run stored (``worker.run.journal``).

``resume_checkpoint`` turns what a takeover found (``StartedIteration``) into the loop's
``Checkpoint`` and the rows that exist: the rounds done count toward ``max_rounds`` and their
tokens toward the budget; of the round under way, calls that finished keep their results, a
write whose outcome was never recorded is *not* run again (the model reads that its outcome
is unknown, with what the tool can tell about it: ``ToolSpec.outcome_of``), a call the run
was parked at goes on with a person's decision (``Checkpoint.approvals``), and the other
calls run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from planner import (
    Approval,
    ApprovalStatus,
    ChatMessage,
    Checkpoint,
    ExecutedCall,
    PolicyDecision,
    SentReminder,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    messages_from_json,
)
from planner.compaction import estimate_message_tokens
from worker.db.statuses import FINAL_CALL_OUTCOMES, CallOutcome
from worker.run.journal import StoredRows
from worker.store.records import StartedIteration
from worker.store.rows import json_safe

__all__ = ["approval_of", "context_at_checkpoint", "resume_checkpoint"]

logger = logging.getLogger(__name__)


async def resume_checkpoint(
    started: StartedIteration,
    *,
    specs: Mapping[str, ToolSpec],
    ctx: ToolContext,
) -> tuple[Checkpoint, StoredRows]:
    """The loop's ``Checkpoint`` for a takeover (see the module docstring), and which of the
    pending round's calls have rows (so they are updated, not duplicated)."""
    checkpoint = _stored_checkpoint(started)
    rows = StoredRows()
    pending = checkpoint.pending_calls()
    if not pending:
        return checkpoint, rows
    approvals = {int(a["position"]): approval_of(a) for a in started.approvals}
    settled, again, standing = await _settle_pending(
        started, pending, specs=specs, ctx=ctx, rows=rows, approvals=approvals
    )
    going_on = {
        p: a for p, a in approvals.items() if (started.rounds, p) in rows.parked or p in again
    }
    resumed = dataclasses.replace(
        checkpoint, settled=settled, approvals=going_on, standing_approvals=tuple(standing)
    )
    return resumed, rows


def _stored_checkpoint(started: StartedIteration) -> Checkpoint:
    """The checkpoint as stored: the log, rounds, tokens, compactions and reminders."""
    messages = messages_from_json(started.messages)
    return Checkpoint(
        messages=messages,
        rounds_done=started.rounds,
        usage=TokenUsage(
            prompt_tokens=started.prompt_tokens, completion_tokens=started.completion_tokens
        ),
        compactions_done=started.compactions,
        compaction_attempts=started.compaction_attempts,
        context_tokens=context_at_checkpoint(messages, started),
        reminders=tuple(
            SentReminder(int(r["round"]), str(r["producer"]), str(r["text"]))
            for r in started.reminders
        ),
    )


async def _settle_pending(
    started: StartedIteration,
    pending: Sequence[ToolCall],
    *,
    specs: Mapping[str, ToolSpec],
    ctx: ToolContext,
    rows: StoredRows,
    approvals: Mapping[int, Approval],
) -> tuple[dict[int, ExecutedCall], set[int], list[Approval]]:
    """Of the pending round's calls (``rows`` learns their stored ids): the settled ones by
    position, the positions that run again, and the approvals that stand (not spent on a
    call that may not have run)."""
    latest: dict[int, dict[str, Any]] = {}
    for stored_row in started.pending_rows:  # ordered by id: a later one of a position wins
        latest[int(stored_row["position"])] = stored_row
    settled: dict[int, ExecutedCall] = {}
    again: set[int] = set()  # started calls that run again, with their approval if any
    standing: list[Approval] = []
    for position, call in enumerate(pending):
        row = latest.get(position)
        if row is None:
            continue  # never started (or a read): it runs now
        key = (started.rounds, position)
        rows.ids[key] = int(row["id"])
        if row["outcome"] in FINAL_CALL_OUTCOMES:
            rows.current.add(key)
            settled[position] = _finished_call(started.rounds, position, call, row)
            continue
        if row["outcome"] == CallOutcome.PARKED:
            rows.parked.add(key)  # it goes on with its approval (or is asked about again)
            continue
        spec = specs.get(call.name)
        if spec is not None and (spec.idempotent or spec.effect is not None):
            # in flight, but safe to run again with its key, or it never took effect (its
            # effect commits with its record, which says started): it runs now
            again.add(position)
            continue
        # started or unknown: it may have taken effect
        approval = approvals.get(position)
        if approval is not None and approval.granted:
            standing.append(approval)
        report = await _outcome_report(spec, call, ctx.for_call(started.rounds, position))
        settled[position] = _unknown_call(
            started.rounds, position, call, started, report, row, standing=approval in standing
        )
    return settled, again, standing


def approval_of(row: Mapping[str, Any]) -> Approval:
    """The ``Approval`` of an ``approval_requests`` row (``StartedIteration.approvals``)."""
    return Approval(
        request_id=int(row["id"]),
        status=ApprovalStatus(row["status"]),
        tool=str(row["tool"]),
        arguments_hash=str(row["arguments_hash"]),
        decided_by=row.get("decided_by"),
        reason=row.get("decision_note"),
        decided_at=row.get("decided_at"),
        target=row.get("target"),
    )


def _finished_call(
    round_no: int, position: int, call: ToolCall, row: Mapping[str, Any]
) -> ExecutedCall:
    decision = row.get("policy_decision")
    return ExecutedCall(
        round_no,
        call,
        row.get("result"),
        row.get("error"),
        PolicyDecision.model_validate(decision) if isinstance(decision, dict) else None,
        index=position,
        ran=row["outcome"] in ("ok", "error"),
    )


def _unknown_call(
    round_no: int,
    position: int,
    call: ToolCall,
    started: StartedIteration,
    report: str,
    row: Mapping[str, Any],
    *,
    standing: bool = False,
) -> ExecutedCall:
    error = (
        f"{call.name} was running when attempt {started.attempt - 1} of this run stopped (its "
        f"worker stopped, or lost its database); it was not run again, and its outcome is "
        f"unknown: it may or may not have taken effect. {report}"
    )
    if standing:
        error += (
            " A person approved this call; the approval still stands for exactly this call: "
            "if it did not take effect, call it again with the same arguments."
        )
    decision = row.get("policy_decision")  # what let it start (an approval, say)
    return ExecutedCall(
        round_no,
        call,
        None,
        error,
        PolicyDecision.model_validate(decision) if isinstance(decision, dict) else None,
        index=position,
        ran=True,
        outcome_unknown=True,
    )


async def _outcome_report(spec: ToolSpec | None, call: ToolCall, ctx: ToolContext) -> str:
    """What the tool can tell about the call, as a sentence for the model."""
    if spec is None or spec.outcome_of is None:
        return "Check before you do it again."
    try:
        report = await spec.outcome_of(dict(call.arguments), ctx)
    except Exception as exc:
        logger.warning("outcome_of of %s failed: %s", call.name, exc)
        return "The tool could not tell what happened; check before you do it again."
    if report is None:
        return "The tool cannot tell what happened; check before you do it again."
    text = report if isinstance(report, str) else json.dumps(json_safe(report))
    return f"The tool reports: {text}"


def context_at_checkpoint(messages: list[ChatMessage], started: StartedIteration) -> int | None:
    """What the context held at the checkpoint, counted as the loop counts it: after a
    compaction that ran after the last reply, the count it left; else the provider's count
    of the last reply's request and answer, plus estimates of the messages after it (tool
    definitions and framing included, which estimating the messages alone would miss).
    ``None`` when the provider reported no usable count (the loop then estimates)."""
    last_compaction = started.last_compaction
    if last_compaction is not None and last_compaction[0] > started.rounds:
        return last_compaction[1]
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role != "assistant":
            continue
        usage = message.reply_info.usage if message.reply_info is not None else None
        if usage is None or not usage.prompt_tokens or usage.estimated:
            return None
        return usage.total_tokens + sum(estimate_message_tokens(m) for m in messages[index + 1 :])
    return None
