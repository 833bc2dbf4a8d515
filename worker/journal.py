"""Durable iterations: what a run writes as it goes, and how a takeover goes on from it.

* ``MissionJournal`` is the ``CallJournal`` and round hook of one run. Before a ``write`` or
  ``destructive`` call runs, it stores the log so far (which ends with the assistant message
  that issued the call) and the call's ``started`` row, in one transaction under the lease; a
  call it cannot record does not run. As soon as the call has its outcome, the row is brought
  up to date. After a round that ran such a call, and at least every ``checkpoint_every``
  rounds otherwise, it commits the round: the log, rounds, tokens, reminders and the round's
  rows, in one transaction under the lease (``MissionStore.commit_round``).
* ``resume_checkpoint`` turns what a takeover found (``StartedIteration``) into the loop's
  ``Checkpoint``: the rounds done count toward ``max_rounds`` and their tokens toward the
  budget; of the round under way, calls that finished keep their results, a write whose
  outcome was never recorded is *not* run again (the model reads that its outcome is unknown,
  with what the tool can tell about it: ``ToolSpec.outcome_of``), and the other calls run.

Read-only rounds are cheap to redo, so they are only committed every ``checkpoint_every``
rounds (default 3): a mission of a few read-only rounds writes nothing more than before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from planner import (
    ChatMessage,
    Checkpoint,
    ExecutedCall,
    PolicyDecision,
    RunInterrupted,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    messages_from_json,
)
from planner.compaction import estimate_message_tokens
from worker.db.engine import describe_error
from worker.db.stores import ClaimedMission, MissionStore, StartedIteration
from worker.db.transient import is_transient
from worker.leases import HeldLease
from worker.transcript import Transcript, json_safe, log_rounds, log_usage

__all__ = [
    "CHECKPOINT_EVERY_ROUNDS",
    "MissionJournal",
    "context_at_checkpoint",
    "resume_checkpoint",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_EVERY_ROUNDS = 3
"""A run commits its rounds at least this often even when they only read."""

_FINAL_OUTCOMES = ("ok", "error", "denied")


class MissionJournal:
    """The durable record of one run (see the module docstring).

    Args:
        store: the database seam.
        mission: the mission (its lease is checked on every write).
        iteration_id: the iteration row.
        worker_id: this worker (the lease owner).
        transcript: the run's record, which the journal writes from.
        specs: the run's tools by name (their policy hints decide what is journaled).
        checkpoint_every: commit at least every this many rounds (≥ 1).
        lease: the run's lease; every write retries transient database failures while it
            holds (``HeldLease.retry``). ``None``: one attempt each.

    A call whose start cannot be recorded because the database stayed unreachable raises
    ``RunInterrupted`` (the run stops and resumes later; the call never started, so it runs
    then): the model is never told to try again for a fault that is not its own.
    """

    def __init__(
        self,
        *,
        store: MissionStore,
        mission: ClaimedMission,
        iteration_id: int,
        worker_id: str,
        transcript: Transcript,
        specs: Mapping[str, ToolSpec],
        checkpoint_every: int = CHECKPOINT_EVERY_ROUNDS,
        lease: HeldLease | None = None,
    ) -> None:
        self.store = store
        self.mission = mission
        self.iteration_id = iteration_id
        self.worker_id = worker_id
        self.transcript = transcript
        self.specs = specs
        self.checkpoint_every = max(1, checkpoint_every)
        self.lease = lease
        self._uncommitted_rounds = 0

    async def _retry(self, operation: Callable[[], Awaitable[T]], *, what: str) -> T:
        if self.lease is None:
            return await operation()
        return await self.lease.retry(operation, what=what)

    async def started(
        self,
        call: ToolCall,
        spec: ToolSpec,
        *,
        round: int,
        position: int,
        decision: PolicyDecision | None,
        ctx: ToolContext,
    ) -> None:
        """Store the log so far and the call's ``started`` row (raises when it cannot: the
        call then does not run).

        Raises:
            RunInterrupted: the database stayed unreachable while the lease held.
            LeaseLostError: another worker owns the mission now.
        """
        transcript = self.transcript
        row = transcript.started_row(call, round, position, ctx.idempotency_key, decision)
        checkpoint = transcript.checkpoint()
        try:
            row_id = await self._retry(
                lambda: self.store.record_call_start(
                    self.mission, self.iteration_id, checkpoint, row, worker_id=self.worker_id
                ),
                what=f"recording the start of {spec.name}",
            )
        except Exception as exc:
            if not is_transient(exc):
                raise
            raise RunInterrupted(
                f"the start of {spec.name} could not be recorded: the database did not "
                f"answer ({describe_error(exc)})"
            ) from exc
        transcript.stored[(round, position)] = row_id
        transcript.archive_written(checkpoint.archive)

    async def finished(self, executed: ExecutedCall) -> None:
        """Bring the call's row up to date with its outcome."""
        row = self.transcript.invocation_row(executed)
        await self._retry(
            lambda: self.store.record_call_outcome(row),
            what=f"recording the outcome of {executed.call.name}",
        )
        self.transcript.current.add((executed.round, executed.index))

    async def round_end(self, round_no: int, calls: Sequence[ExecutedCall]) -> None:
        """Commit the round when it ran a write or destructive call, or when enough read-only
        rounds went by. A commit that fails is logged: the run goes on, and the next commit
        (or the end of the run) writes it."""
        self._uncommitted_rounds += 1
        wrote = any(
            c.ran and (spec := self.specs.get(c.call.name)) and spec.policy_hint != "read"
            for c in calls
        )
        if not wrote and self._uncommitted_rounds < self.checkpoint_every:
            return
        await self.commit()

    async def commit(self) -> bool:
        """Commit everything not yet written; False when it could not."""
        rows = self.transcript.invocation_rows()
        checkpoint = self.transcript.checkpoint()
        try:
            ids = await self._retry(
                lambda: self.store.commit_round(
                    self.mission, self.iteration_id, checkpoint, rows, worker_id=self.worker_id
                ),
                what="committing the round",
            )
        except Exception:
            logger.exception("could not commit the round; the next commit will")
            return False
        if ids is None:
            logger.warning("lease lost: the round was not committed")
            return False
        self.transcript.mark_written(rows, ids)
        self.transcript.archive_written(checkpoint.archive)
        self._uncommitted_rounds = 0
        return True


async def resume_checkpoint(
    started: StartedIteration,
    *,
    transcript: Transcript,
    specs: Mapping[str, ToolSpec],
    ctx: ToolContext,
) -> Checkpoint:
    """The loop's ``Checkpoint`` for a takeover (see the module docstring). Records in
    ``transcript`` which of the pending round's rows exist, so they are updated, not
    duplicated."""
    messages = messages_from_json(started.messages)
    transcript.compactions = started.compactions
    transcript.archived = started.compaction_attempts
    # what the log no longer shows (compaction folded it) still counts
    transcript.hidden_rounds = max(0, started.rounds - log_rounds(messages))
    shown = log_usage(messages)
    transcript.hidden_usage = TokenUsage(
        prompt_tokens=max(0, started.prompt_tokens - shown.prompt_tokens),
        completion_tokens=max(0, started.completion_tokens - shown.completion_tokens),
        estimated=shown.estimated,
    )
    checkpoint = Checkpoint(
        messages=messages,
        rounds_done=started.rounds,
        usage=TokenUsage(
            prompt_tokens=started.prompt_tokens, completion_tokens=started.completion_tokens
        ),
        compactions_done=started.compactions,
        compaction_attempts=started.compaction_attempts,
        context_tokens=context_at_checkpoint(messages, started),
    )
    pending = checkpoint.pending_calls()
    if not pending:
        return checkpoint
    latest: dict[int, dict[str, Any]] = {}
    for stored_row in started.pending_rows:  # ordered by id: a later one of a position wins
        latest[int(stored_row["position"])] = stored_row
    settled: dict[int, ExecutedCall] = {}
    for position, call in enumerate(pending):
        row = latest.get(position)
        if row is None:
            continue  # never started (or a read): it runs now
        key = (started.rounds, position)
        transcript.stored[key] = int(row["id"])
        if row["outcome"] in _FINAL_OUTCOMES:
            transcript.current.add(key)
            transcript.settled_earlier.add(key)
            settled[position] = _finished_call(started.rounds, position, call, row)
        else:  # started or unknown: it may have taken effect
            spec = specs.get(call.name)
            report = await _outcome_report(spec, call, ctx.for_call(started.rounds, position))
            settled[position] = _unknown_call(started.rounds, position, call, started, report)
    return Checkpoint(
        messages=messages,
        rounds_done=started.rounds,
        usage=checkpoint.usage,
        settled=settled,
        compactions_done=started.compactions,
        compaction_attempts=started.compaction_attempts,
        context_tokens=checkpoint.context_tokens,
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
    round_no: int, position: int, call: ToolCall, started: StartedIteration, report: str
) -> ExecutedCall:
    error = (
        f"{call.name} was running when the worker running this mission stopped (attempt "
        f"{started.attempt - 1}); it was not run again, and its outcome is unknown: it may or "
        f"may not have taken effect. {report}"
    )
    return ExecutedCall(
        round_no, call, None, error, None, index=position, ran=True, outcome_unknown=True
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
