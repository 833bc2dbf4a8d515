"""What happens in a run of the planner loop, as immutable, typed values: the run events.

The loop reports everything it does through one sink (``RunSink``), in the order it happens;
``planner.record`` folds the events into the run's record (messages, usage, rounds, calls,
reminders, compactions, outcome), and everything that reads a run (the worker's journal and
store, resume, replay, rerun, metrics, traces) reads that record or the events themselves.

One round, in order::

    RequestSent  (the reminders it carried)        or  RequestFailed (the model could not answer)
    ReplyJudged  (the stored reply and the verdict on it)
    per call, in the model's order (reads overlapping, up to the cap):
        CallDecided   (the gate's decision; only calls that reached the gate)
        CallStarted   (its handler is about to run)
        CallFinished  (its outcome; every call has one, refused ones included; completion order)
    ReadsOverlapped   (a group of reads ran concurrently)
    RoundEnded        (every call's result is in the log: a checkpoint may be taken here)

A round whose call the gate *asks* about (verdict ``ask``, ``planner.approvals``) stops at that
call: ``ApprovalRequested`` instead of its ``CallStarted``; the calls after it do not start,
there is no ``RoundEnded``, and ``RunStopped`` follows with ``awaiting_approval``. A run
resumed with decisions on such calls reports each as ``ApprovalDecided`` right after
``RunStarted``.

Before a round, ``Compacted`` or ``CompactionFailed``; first ``RunStarted``, last ``RunStopped``
(unless the run was cancelled or interrupted). The model of this design is pydantic-ai's
event stream (``FunctionToolCallEvent``, ``FunctionToolResultEvent``) and OpenHands' event
stream: typed, immutable, one stream, one reducer.

Each event (and ``Reminder``, ``SentReminder``) is a ``typing.NamedTuple``, as
``planner.policy.PolicyInput`` is: the loop makes several per round, and a NamedTuple is made
in a quarter of the time of a frozen dataclass (which sets each field through
``object.__setattr__``). Dispatch on ``type(event)`` (as ``planner.record`` does) or
``isinstance``; two events of different types never stand for each other, even where their
fields are equal as tuples.

A sink is an async callable, awaited for each event before the loop goes on:
``CallStarted`` is awaited before the handler runs, so a sink can record a write durably
first; an exception it raises for ``CallStarted`` keeps the call from running (its result says
so), except ``RunInterrupted``, which stops the run. What a sink raises for any other event
propagates out of the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple

from planner.messages import ChatMessage, TokenUsage, ToolCall

if TYPE_CHECKING:
    from planner.approvals import Approval
    from planner.calls import ExecutedCall
    from planner.compaction import Compaction, CompactionError
    from planner.policy import PolicyDecision
    from planner.replies import StopReason
    from planner.tools import PolicyHint

__all__ = [
    "ApprovalDecided",
    "ApprovalRequested",
    "CallDecided",
    "CallFinished",
    "CallStarted",
    "Checkpoint",
    "Compacted",
    "CompactionFailed",
    "ReadsOverlapped",
    "Reminder",
    "ReminderRole",
    "ReplyJudged",
    "RequestFailed",
    "RequestSent",
    "RoundEnded",
    "RunEvent",
    "RunSink",
    "RunStarted",
    "RunStopped",
    "SentReminder",
]

ReminderRole = Literal["system", "user"]


class Reminder(NamedTuple):
    """A hint a reminder channel gives for one request: its ``text``, the ``producer`` that
    wrote it (``None``: unnamed), and the ``role`` it is sent with (``system``, or ``user``
    for chat templates that refuse a system message after the first)."""

    text: str
    producer: str | None = None
    role: ReminderRole = "system"


class SentReminder(NamedTuple):
    """One reminder sent with the request of ``round``: the audit record (stored apart from
    the message log)."""

    round: int
    producer: str
    text: str

    def to_json(self) -> dict[str, object]:
        """``{"round", "producer", "text"}``, the stored form."""
        return {"round": self.round, "producer": self.producer, "text": self.text}


@dataclass(frozen=True)
class Checkpoint:
    """Where an earlier attempt at a run stopped, to go on from (a resume).

    Attributes:
        messages: the stored log so far: system, prior and user messages, then the rounds.
            When it ends with an assistant message that calls tools, that round was under
            way: its calls get their results first (``settled`` ones as given, the others
            run), then the loop goes on with the next round.
        rounds_done: completion requests the log answers (they count toward ``max_rounds``).
        usage: tokens those requests cost (they count toward the usage reported).
        settled: results of the pending round's calls that must not run again, by 0-based
            position: calls an earlier attempt finished, and writes whose outcome is unknown.
        compactions_done: compactions the earlier attempts did.
        compaction_attempts: compactions they tried, failed ones included (default:
            ``compactions_done``); they count toward ``Compactor.max_per_iteration``, and the
            next one is numbered after them.
        context_tokens: what the context held at the checkpoint, as the earlier attempt
            counted it (the provider's last usage plus estimates, or the count after a
            compaction); ``None``: estimated from the messages and tool definitions.
        reminders: the reminders the earlier attempts sent (the audit goes on from them).
        approvals: people's decisions on calls of the pending round that the gate asked
            about, by 0-based position (``planner.approvals``): a granted one lets exactly
            that call run, a denied or expired one answers it with its refusal.
        standing_approvals: granted approvals of calls whose outcome is unknown (their worker
            died while they ran; they are in ``settled``): each still lets exactly that call
            (the same tool and arguments) run once more in this run, should the model find it
            did not take effect and call it again, without asking a person again.
    """

    messages: Sequence[ChatMessage]
    rounds_done: int
    usage: TokenUsage = field(default_factory=TokenUsage)
    settled: Mapping[int, ExecutedCall] = field(default_factory=dict)
    compactions_done: int = 0
    compaction_attempts: int | None = None
    context_tokens: int | None = None
    reminders: Sequence[SentReminder] = ()
    approvals: Mapping[int, Approval] = field(default_factory=dict)
    standing_approvals: Sequence[Approval] = ()

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """The calls of the round under way when the checkpoint was taken (none when the log
        does not end with an assistant message that calls tools)."""
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant":
            return ()
        return last.tool_calls


class RunStarted(NamedTuple):
    """The run began with ``messages`` in its log: the head (system prompt, prior messages,
    objective), or, resuming an earlier attempt, its ``checkpoint``'s log."""

    messages: tuple[ChatMessage, ...]
    checkpoint: Checkpoint | None = None


class RequestSent(NamedTuple):
    """The request of ``round`` went out with ``reminders`` (that request only); the context
    held about ``context_tokens`` tokens before them (0 when the loop does not count)."""

    round: int
    reminders: tuple[SentReminder, ...] = ()
    context_tokens: int = 0


class RequestFailed(NamedTuple):
    """The model could not answer the request of ``round`` (after the provider's retries):
    ``error`` says why; ``usage`` is what the endpoint reported the failed attempts cost."""

    round: int
    error: str
    usage: TokenUsage


class ReplyJudged(NamedTuple):
    """The reply of ``round`` as it is stored (``reply``: an assistant message), what it cost,
    and the verdict on it (``planner.replies``): the messages the loop adds to the log after it
    (``follow_up``: results of calls that are not run, a note that the reply was cut), and the
    ``stop_reason`` and ``error`` when the run ends with it (``None``: it goes on)."""

    round: int
    reply: ChatMessage
    usage: TokenUsage
    follow_up: tuple[ChatMessage, ...] = ()
    stop_reason: StopReason | None = None
    error: str | None = None
    context_tokens: int = 0


class CallDecided(NamedTuple):
    """The policy gate decided the call at ``position`` (0-based, the model's order) of
    ``round``."""

    round: int
    position: int
    call: ToolCall
    decision: PolicyDecision


class CallStarted(NamedTuple):
    """The handler of the call at ``position`` of ``round`` is about to run; ``hint`` is its
    tool's policy hint and ``idempotency_key`` the key a ``write`` or ``destructive`` call
    carries (``None`` for reads)."""

    round: int
    position: int
    call: ToolCall
    hint: PolicyHint
    idempotency_key: str | None = None
    decision: PolicyDecision | None = None


class CallFinished(NamedTuple):
    """A call has its outcome (refused ones too: unknown tool, invalid arguments, denied), in
    completion order; ``settled``: an earlier attempt of a resumed run finished it, or left its
    outcome unknown (it did not run now)."""

    executed: ExecutedCall
    settled: bool = False


class ApprovalRequested(NamedTuple):
    """The gate asked for a person's approval of the call at ``position`` of ``round``
    (``decision``: verdict ``ask``): the call does not run, the calls after it wait, and the
    run stops with ``awaiting_approval``; ``reply_text`` is the model's text in the reply that
    issued it (``None``: none); ``target`` what the call would act on, as its tool read it back
    for the reviewer (``ToolSpec.describe``; ``None``: the tool says nothing)."""

    round: int
    position: int
    call: ToolCall
    decision: PolicyDecision
    reply_text: str | None = None
    target: str | None = None


class ApprovalDecided(NamedTuple):
    """A resumed run found a person's decision (``approval``) on the call at ``position`` of
    ``round``, which it had asked about."""

    round: int
    position: int
    call: ToolCall
    approval: Approval


class ReadsOverlapped(NamedTuple):
    """``size`` read calls of ``round`` ran concurrently."""

    round: int
    size: int


class RoundEnded(NamedTuple):
    """Every call of ``round`` has its result in the log; ``calls`` in the model's order."""

    round: int
    calls: tuple[ExecutedCall, ...]


class Compacted(NamedTuple):
    """Before the request of ``round`` the middle of the log was summarised: ``compaction``
    holds the new log and the folded messages (what an archive keeps); its token counts are
    the loop's count of the context."""

    round: int
    compaction: Compaction


class CompactionFailed(NamedTuple):
    """A compaction was tried before the request of ``round`` and changed nothing."""

    round: int
    error: CompactionError


class RunStopped(NamedTuple):
    """The run ended after ``rounds`` completion requests with ``stop_reason``; ``error`` for
    a failure, ``final_answer`` for an answer."""

    rounds: int
    stop_reason: StopReason
    error: str | None = None
    final_answer: str | None = None


RunEvent = (
    RunStarted
    | RequestSent
    | RequestFailed
    | ReplyJudged
    | CallDecided
    | CallStarted
    | CallFinished
    | ApprovalRequested
    | ApprovalDecided
    | ReadsOverlapped
    | RoundEnded
    | Compacted
    | CompactionFailed
    | RunStopped
)
"""Every event a run of the loop reports."""

RunSink = Callable[[RunEvent], Awaitable[None]]
"""Where a loop reports its events: ``await sink(event)`` for each one, in order, before the
loop goes on (see the module docstring)."""
