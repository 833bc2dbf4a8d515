"""The record of a run: one state, derived from the run's events by one fold.

``RunLog`` folds events (``planner.events``) as they come, in O(1) per event, and gives a frozen
``RunRecord`` when asked (``snapshot``); ``record_of(events)`` is the same fold as a pure
function. The loop keeps its own state in a ``RunLog``; the worker folds the same events into
its own, for what it stores, and gets the same record: messages, rounds and usage are counted
in one place only, here.

What the record holds:

* ``messages``: the stored log (system, prior, user, then the rounds; the middle replaced by a
  summary where the context was compacted). Reminders never appear in it.
* ``rounds``: the rounds answered so far (a resumed run counts on from its checkpoint): what a
  checkpoint stores and a resume goes on after; once the run stopped, the completion requests
  it made, a failed last one included. ``usage``: the tokens of every request, summarisations
  included.
* ``calls``: every call with its outcome, round by round in the model's order;
  ``settled``: the ``(round, position)`` of the calls an earlier attempt finished.
* ``reminders``: every reminder sent (the checkpoint's first, on a resume).
* ``archive``: this attempt's compactions and failed compaction attempts, numbered on from
  the checkpoint's (``ArchiveEntry.index``); ``compactions_done`` counts the earlier ones too.
* the outcome: ``stop_reason``, ``error``, ``final_answer`` (``None`` while the run goes on).
* approvals: the call the run stopped at to wait for a person (``pending_approval``: its
  ``ApprovalRequested``), and the decisions a resumed run found (``approvals``).

A resumed run starts from a ``planner.checkpoint.Checkpoint`` (its ``RunStarted`` carries it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from planner.calls import ExecutedCall, tool_result_message
from planner.compaction import Compaction, CompactionError
from planner.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallFinished,
    Compacted,
    CompactionFailed,
    ReplyJudged,
    RequestFailed,
    RequestSent,
    RoundEnded,
    RunEvent,
    RunStarted,
    RunStopped,
    SentReminder,
)
from planner.messages import ChatMessage, TokenUsage
from planner.replies import StopReason

__all__ = ["ArchiveEntry", "RunLog", "RunRecord", "record_of"]


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """One compaction of this attempt (``compaction``) or a failed attempt (``error``; a
    summariser that was asked and changed nothing), numbered ``index`` among every archived
    attempt of the iteration, before the request of ``round``."""

    index: int
    round: int
    compaction: Compaction | None = None
    error: CompactionError | None = None


@dataclass(frozen=True)
class RunRecord:
    """A run as its events tell it, at one moment (see the module docstring)."""

    messages: tuple[ChatMessage, ...] = ()
    rounds: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    calls: tuple[ExecutedCall, ...] = ()
    settled: frozenset[tuple[int, int]] = frozenset()
    reminders: tuple[SentReminder, ...] = ()
    archive: tuple[ArchiveEntry, ...] = ()
    compactions_done: int = 0
    compaction_errors: tuple[str, ...] = ()
    stop_reason: StopReason | None = None
    error: str | None = None
    final_answer: str | None = None
    pending_approval: ApprovalRequested | None = None
    approvals: tuple[ApprovalDecided, ...] = ()

    @property
    def finished(self) -> bool:
        """True once the run stopped (``RunStopped``)."""
        return self.stop_reason is not None


class RunLog:
    """The fold of a run's events (see the module docstring); also a ``RunSink``.

    The lists it exposes (``messages``, ``calls``: the calls of the rounds that ended, in the
    model's order) are its own: read them, never change them. The calls of a round under way
    are in the snapshot, from their ``CallFinished``.
    """

    __slots__ = (
        "_archived",
        "_round_calls",
        "approvals",
        "archive",
        "calls",
        "compaction_errors",
        "compactions_done",
        "error",
        "final_answer",
        "last_call",
        "last_round_calls",
        "messages",
        "pending_approval",
        "reminders",
        "rounds",
        "settled",
        "stop_reason",
        "usage",
    )

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.rounds = 0
        self.usage = TokenUsage()
        self.calls: list[ExecutedCall] = []
        self.settled: set[tuple[int, int]] = set()
        self.reminders: list[SentReminder] = []
        self.archive: list[ArchiveEntry] = []
        self.compactions_done = 0
        self.compaction_errors: list[str] = []
        self.stop_reason: StopReason | None = None
        self.error: str | None = None
        self.final_answer: str | None = None
        self._archived = 0
        # the calls of the previous round, in the model's order (none before the first round,
        # and after a round without calls), and the last call of the last round that had any
        self.last_round_calls: tuple[ExecutedCall, ...] = ()
        self.last_call: ExecutedCall | None = None
        self._round_calls: list[ExecutedCall] = []  # of the round under way, as they finish
        self.pending_approval: ApprovalRequested | None = None
        self.approvals: list[ApprovalDecided] = []

    def calls_so_far(self) -> list[ExecutedCall]:
        """Every call with its outcome so far, the round under way's included, in the model's
        order."""
        return [*self.calls, *sorted(self._round_calls, key=_source_order)]

    @property
    def compaction_attempts(self) -> int:
        """Archived compaction attempts so far, the checkpoint's included."""
        return self._archived

    def apply(self, event: RunEvent) -> None:
        """Fold ``event`` into the log."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    async def __call__(self, event: RunEvent) -> None:
        """``apply``, as a ``RunSink``."""
        self.apply(event)

    def snapshot(self) -> RunRecord:
        """The record as it stands now (a frozen copy)."""
        return RunRecord(
            messages=tuple(self.messages),
            rounds=self.rounds,
            usage=self.usage,
            calls=tuple(self.calls_so_far()),
            settled=frozenset(self.settled),
            reminders=tuple(self.reminders),
            archive=tuple(self.archive),
            compactions_done=self.compactions_done,
            compaction_errors=tuple(self.compaction_errors),
            stop_reason=self.stop_reason,
            error=self.error,
            final_answer=self.final_answer,
            pending_approval=self.pending_approval,
            approvals=tuple(self.approvals),
        )

    # -- the fold, one method per event (``apply`` picks it; the loop calls its own directly) --

    def fold_run_started(self, event: RunStarted) -> None:
        self.messages = list(event.messages)
        checkpoint = event.checkpoint
        if checkpoint is not None:
            self.rounds = checkpoint.rounds_done
            self.usage = checkpoint.usage
            self.compactions_done = checkpoint.compactions_done
            attempts = checkpoint.compaction_attempts
            self._archived = checkpoint.compactions_done if attempts is None else attempts
            self.reminders = list(checkpoint.reminders)

    def fold_request_sent(self, event: RequestSent) -> None:
        self.reminders.extend(event.reminders)
        self.last_round_calls = ()  # a round that ends without calls leaves none for the next

    def fold_request_failed(self, event: RequestFailed) -> None:
        self.usage = self.usage + event.usage

    def fold_reply_judged(self, event: ReplyJudged) -> None:
        self.rounds = max(self.rounds, event.round)
        self.usage = self.usage + event.usage
        self.messages.append(event.reply)
        self.messages.extend(event.follow_up)

    def fold_call_finished(self, event: CallFinished) -> None:
        executed = event.executed
        self._round_calls.append(executed)
        if event.settled:
            self.settled.add((executed.round, executed.index))

    def fold_approval_requested(self, event: ApprovalRequested) -> None:
        self.pending_approval = event

    def fold_approval_decided(self, event: ApprovalDecided) -> None:
        self.approvals.append(event)

    def fold_round_ended(self, event: RoundEnded) -> None:
        calls = event.calls
        self.calls.extend(calls)  # the round's calls, in the model's order
        self._round_calls = []
        self.messages.extend([tool_result_message(c) for c in calls])
        self.last_round_calls = calls
        if calls:
            self.last_call = calls[-1]

    def fold_compacted(self, event: Compacted) -> None:
        compaction = event.compaction
        self.messages = list(compaction.messages)
        self.usage = self.usage + compaction.usage
        self.compactions_done += 1
        self._archived += 1
        self.archive.append(ArchiveEntry(self._archived, event.round, compaction=compaction))

    def fold_compaction_failed(self, event: CompactionFailed) -> None:
        error = event.error
        self.usage = self.usage + error.usage
        self.compaction_errors.append(str(error))
        if error.reason == "nothing_to_fold":  # no summariser was asked: nothing to archive
            return
        self._archived += 1
        self.archive.append(ArchiveEntry(self._archived, event.round, error=error))

    def fold_run_stopped(self, event: RunStopped) -> None:
        self.rounds = event.rounds
        self.stop_reason = event.stop_reason
        self.error = event.error
        self.final_answer = event.final_answer


_HANDLERS: dict[type, Callable[[RunLog, Any], None]] = {
    RunStarted: RunLog.fold_run_started,
    RequestSent: RunLog.fold_request_sent,
    RequestFailed: RunLog.fold_request_failed,
    ReplyJudged: RunLog.fold_reply_judged,
    CallFinished: RunLog.fold_call_finished,
    ApprovalRequested: RunLog.fold_approval_requested,
    ApprovalDecided: RunLog.fold_approval_decided,
    RoundEnded: RunLog.fold_round_ended,
    Compacted: RunLog.fold_compacted,
    CompactionFailed: RunLog.fold_compaction_failed,
    RunStopped: RunLog.fold_run_stopped,
}


def record_of(events: Iterable[RunEvent]) -> RunRecord:
    """The record ``events`` tell (the pure form of ``RunLog``)."""
    log = RunLog()
    for event in events:
        log.apply(event)
    return log.snapshot()


def _source_order(call: ExecutedCall) -> tuple[int, int]:
    return (call.round, call.index)
