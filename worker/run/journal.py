"""Durable iterations: what a run writes as it goes, and how a takeover goes on from it.

* ``MissionJournal`` is the run's sink (``planner.RunSink``): it folds the run's events into
  the run's record (``planner.RunLog``) and writes from that record, under the lease, one
  statement at a time (``MissionStore.commit_round`` / ``record_call_start``):

  - before a ``write`` or ``destructive`` call runs (``CallStarted``, awaited by the loop), the
    log so far (which ends with the assistant message that issued the call), the calls of the
    round that finished, and the call's ``started`` row; a call it cannot record does not run,
    and one whose database stayed unreachable stops the run (``RunInterrupted``). With the
    policy gate on, that statement is the gate's: it reserves the rate-limit slot and starts
    the call together (``start_reserved``, used by ``worker.run.mission_gate.MissionGate``);
  - a journaled call's outcome goes with the next statement the run makes (the next call's
    start, or the round's commit);
  - after a round that ran such a call, and at least every ``checkpoint_every`` rounds
    otherwise, the round: the log, rounds, tokens, reminders, the round's rows and the
    compactions not stored yet (``RoundEnded``).

Read-only rounds are cheap to redo, so they are only committed every ``checkpoint_every``
rounds (default 3): a mission of a few read-only rounds writes nothing more than before.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from planner import (
    CallFinished,
    CallStarted,
    ChatMessage,
    PolicyDecision,
    PolicyMode,
    RateLimit,
    Reservation,
    RoundEnded,
    RunEvent,
    RunInterrupted,
    RunLog,
    RunRecord,
    ToolCall,
    ToolContext,
    ToolSpec,
)
from planner.errors import ToolError
from worker.db.transient import describe_error, is_transient, refused_text
from worker.run.leases import HeldLease
from worker.store.base import LeaseLostError, MissionStore
from worker.store.records import (
    ClaimedMission,
    RoundCheckpoint,
    StartedIteration,
    ToolInvocationRow,
)
from worker.store.rows import archive_row, invocation_row, json_safe, messages_json, started_row

__all__ = [
    "CHECKPOINT_EVERY_ROUNDS",
    "MissionJournal",
    "StoredRows",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_EVERY_ROUNDS = 3
"""A run commits its rounds at least this often even when they only read."""


@dataclass
class StoredRows:
    """Which of a run's calls have a ``tool_invocations`` row (``ids``, by ``(round,
    position)``), which of those rows are up to date (``current``), and which are ``parked``
    (a call that waited for approval: its start is still to be journaled, on that row)."""

    ids: dict[tuple[int, int], int] = field(default_factory=dict)
    current: set[tuple[int, int]] = field(default_factory=set)
    parked: set[tuple[int, int]] = field(default_factory=set)


class MissionJournal:
    """The durable record of one run (see the module docstring).

    Args:
        store: the database seam.
        mission: the mission (its lease is checked on every write).
        iteration: the iteration row (its ``id`` and ``attempt``).
        worker_id: this worker (the lease owner).
        policy_mode: the mode the run's calls are decided in (recorded on each row).
        specs: the run's tools by name (their policy hints decide what is journaled).
        checkpoint_every: commit at least every this many rounds (≥ 1).
        lease: the run's lease; every write retries transient database failures while it
            holds (``HeldLease.retry``). ``None``: one attempt each.
        rows: the rows a takeover found (``resume_checkpoint``).
        archived: compactions of the iteration stored so far (a takeover's: the earlier
            attempts'); the journal stores the later ones.
        summariser: the summarising model's name, recorded on failed compaction attempts.

    A call whose start cannot be recorded because the database stayed unreachable raises
    ``RunInterrupted`` (the run stops and resumes later; the call never started, so it runs
    then): the model is never told to try again for a fault that is not its own.
    """

    def __init__(
        self,
        *,
        store: MissionStore,
        mission: ClaimedMission,
        iteration: StartedIteration,
        worker_id: str,
        policy_mode: PolicyMode,
        specs: Mapping[str, ToolSpec],
        checkpoint_every: int = CHECKPOINT_EVERY_ROUNDS,
        lease: HeldLease | None = None,
        rows: StoredRows | None = None,
        archived: int = 0,
        summariser: str | None = None,
    ) -> None:
        self.store = store
        self.mission = mission
        self.iteration_id = iteration.id
        self.attempt = iteration.attempt
        self.worker_id = worker_id
        self.policy_mode = policy_mode
        self.specs = specs
        self.checkpoint_every = max(1, checkpoint_every)
        self.lease = lease
        self.rows = rows or StoredRows()
        self.summariser = summariser
        self.log = RunLog()
        self._archived = archived
        self._last_log: tuple[list[ChatMessage], list[dict[str, Any]]] = ([], [])
        self._uncommitted_rounds = 0

    @property
    def record(self) -> RunRecord:
        """The run's record so far."""
        return self.log.snapshot()

    async def __call__(self, event: RunEvent) -> None:
        """Fold ``event``; write what it calls for (see the module docstring)."""
        self.log.apply(event)
        if isinstance(event, CallStarted):
            key = (event.round, event.position)
            if event.hint != "read" and (key not in self.rows.ids or key in self.rows.parked):
                await self._start(event)
        elif isinstance(event, CallFinished):
            key = (event.executed.round, event.executed.index)
            if key in self.rows.ids and not event.settled:
                self.rows.current.discard(key)  # its outcome goes with the next write
        elif isinstance(event, RoundEnded):
            await self._round_ended(event)

    # -- what is written --------------------------------------------------------------------

    def checkpoint(self) -> RoundCheckpoint:
        """What a write stores on the iteration row: the record's log, rounds, tokens and
        reminders, and the compactions not stored yet."""
        log = self.log
        return RoundCheckpoint(
            messages=self._stored_log(log.messages),
            rounds=log.rounds,
            prompt_tokens=log.usage.prompt_tokens,
            completion_tokens=log.usage.completion_tokens,
            reminders=[json_safe(r.to_json()) for r in log.reminders],
            archive=tuple(
                archive_row(entry, attempt=self.attempt, model=self.summariser)
                for entry in log.archive
                if entry.index > self._archived
            ),
        )

    def _stored_log(self, messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        """``messages_json(messages)``, each message converted once per run: the stored form
        of the messages the log shares with the last checkpoint's (the same objects, from the
        start: messages are immutable; a compaction replaces the ones it folds) is reused,
        so a checkpoint converts what the round added, not the whole log again."""
        before, stored = self._last_log
        kept = 0
        for old, new in zip(before, messages, strict=False):
            if old is not new:
                break
            kept += 1
        converted = stored[:kept] + messages_json(messages[kept:])
        self._last_log = (list(messages), converted)
        return converted

    def pending_rows(self) -> list[ToolInvocationRow]:
        """The ``tool_invocations`` rows still to write, in source order (round, then position
        in the round: concurrent reads finish in any order, the stored story reads as the model
        wrote it): new calls to insert, and stored rows whose outcome changed to update."""
        rows = self.rows
        return [
            invocation_row(
                call,
                attempt=self.attempt,
                policy_mode=self.policy_mode,
                row_id=rows.ids.get((call.round, call.index)),
            )
            for call in self.log.calls_so_far()
            if (call.round, call.index) not in rows.current
        ]

    def written(
        self,
        rows: Sequence[ToolInvocationRow],
        new_ids: Mapping[tuple[int, int], int],
        checkpoint: RoundCheckpoint,
    ) -> None:
        """``checkpoint`` and ``rows`` were stored; the new rows (no ``row_id``) got
        ``new_ids`` (by ``(round, position)``; a row missing from them was not stored)."""
        for row in rows:
            key = (row.round, row.position)
            row_id = row.row_id if row.row_id is not None else new_ids.get(key)
            if row_id is None:
                continue
            self.rows.ids[key] = row_id
            if row.outcome != "parked":
                self.rows.parked.discard(key)
            if row.outcome != "started":
                self.rows.current.add(key)
        if checkpoint.archive:
            self._archived = max(r.compaction_index for r in checkpoint.archive)

    def bound(self, spec: ToolSpec) -> ToolSpec:
        """``spec`` as this run calls it: a write or destructive tool with an ``effect`` runs
        it in the store's transaction that also marks its ``started`` row ``ok``
        (``MissionStore.run_effect``), so its outcome is never unknown; any other as it is.

        The handler raises ``RunInterrupted`` when the database stays unreachable or the lease
        was lost (nothing committed: the takeover runs the call again)."""
        effect = spec.effect
        if effect is None or spec.policy_hint == "read":
            return spec
        handler = spec.handler

        async def handle(arguments: dict[str, Any], ctx: ToolContext) -> Any:
            row_id = self.rows.ids.get((ctx.round or 0, ctx.position or 0))
            if row_id is None:  # never journaled (no started row): its own transaction
                return await handler(arguments, ctx)
            try:
                return await self.store.run_effect(
                    self.mission,
                    row_id,
                    lambda connection: effect(arguments, ctx, connection),
                    worker_id=self.worker_id,
                )
            except LeaseLostError as exc:
                raise RunInterrupted(f"{spec.name} was not run: {exc}") from exc
            except Exception as exc:
                if not is_transient(exc):
                    if isinstance(exc, SQLAlchemyError):  # in words, not the statement's text
                        raise ToolError(f"{spec.name} failed: {refused_text(exc)}") from exc
                    raise
                raise RunInterrupted(
                    f"{spec.name}: its database did not answer ({describe_error(exc)}); "
                    "nothing was committed, and the call runs again when the run resumes"
                ) from exc

        return spec.with_handler(handle)

    async def start_reserved(
        self,
        call: ToolCall,
        spec: ToolSpec,
        ctx: ToolContext,
        *,
        round: int,
        position: int,
        limit: RateLimit,
        consumer: str,
        run_anyway: bool,
        decision: PolicyDecision | None = None,
    ) -> Reservation:
        """The policy gate's statement for a write or destructive call: reserve its
        rate-limit slot and, when one was taken (or ``run_anyway``: log-only runs a refused
        call too), store the log so far and the call's ``started`` row (with the rules'
        ``decision`` that lets it start), in one statement.

        Raises:
            RunInterrupted: the database stayed unreachable while the lease held (the call
                does not run), or the lease was lost.
        """
        row = started_row(
            call,
            round=round,
            position=position,
            attempt=self.attempt,
            idempotency_key=ctx.idempotency_key,
            policy_mode=self.policy_mode,
            decision=decision,
        )
        row = dataclasses.replace(row, row_id=self.rows.ids.get((round, position)))
        rows = [*self.pending_rows(), row]
        checkpoint = self.checkpoint()
        written = await self._write(
            lambda: self.store.record_call_start(
                self.mission,
                self.iteration_id,
                checkpoint,
                rows,
                worker_id=self.worker_id,
                reserve=(limit, consumer, run_anyway),
            ),
            what=f"reserving and recording the start of {spec.name}",
        )
        assert written.reservation is not None
        self.written(rows, written.ids, checkpoint)  # refused: the started row is not there
        return written.reservation

    async def _start(self, event: CallStarted) -> None:
        row = started_row(
            event.call,
            round=event.round,
            position=event.position,
            attempt=self.attempt,
            idempotency_key=event.idempotency_key,
            policy_mode=self.policy_mode,
        )
        row = dataclasses.replace(row, row_id=self.rows.ids.get((event.round, event.position)))
        rows = [*self.pending_rows(), row]
        checkpoint = self.checkpoint()
        written = await self._write(
            lambda: self.store.record_call_start(
                self.mission, self.iteration_id, checkpoint, rows, worker_id=self.worker_id
            ),
            what=f"recording the start of {event.call.name}",
        )
        self.written(rows, written.ids, checkpoint)

    async def _round_ended(self, event: RoundEnded) -> None:
        """Commit the round when it ran a write or destructive call, or when enough read-only
        rounds went by. A commit that fails is logged: the run goes on, and the next commit
        (or the end of the run) writes it."""
        self._uncommitted_rounds += 1
        wrote = any(
            c.ran and (spec := self.specs.get(c.call.name)) and spec.policy_hint != "read"
            for c in event.calls
        )
        if not wrote and self._uncommitted_rounds < self.checkpoint_every:
            return
        await self.commit()

    async def commit(self) -> bool:
        """Commit everything not yet written; False when it could not."""
        rows = self.pending_rows()
        checkpoint = self.checkpoint()
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
        self.written(rows, ids, checkpoint)
        self._uncommitted_rounds = 0
        return True

    async def _write(self, operation: Callable[[], Awaitable[T]], *, what: str) -> T:
        """A write a call cannot run without: transient failures retried while the lease
        holds, then ``RunInterrupted``."""
        try:
            return await self._retry(operation, what=what)
        except Exception as exc:
            if not is_transient(exc):
                raise
            raise RunInterrupted(
                f"{what} failed: the database did not answer ({describe_error(exc)})"
            ) from exc

    async def _retry(self, operation: Callable[[], Awaitable[T]], *, what: str) -> T:
        if self.lease is None:
            return await operation()
        return await self.lease.retry(operation, what=what)
