"""The planner loop: LLM ↔ tools over several rounds.

One round = one completion request, then the tool calls it asked for. The loop stops when the
model answers without tool calls (``final_answer``), when ``max_rounds`` rounds have run and
the model still asks for tools (``max_rounds``), or when the model cannot answer
(``llm_error``; the error is on the result, the log so far is kept). A reply that is cut,
filtered or empty is judged by ``planner.replies`` (stop reasons ``truncated``,
``content_filtered``, ``empty_answer``); those and ``llm_error`` are failures.

Reminders from ``reminder_channel`` are appended to *that request only* as
``<reminder>…</reminder>`` system messages; they never enter ``PlannerLoopResult.messages``.

A call the policy gate asks a person about (verdict ``ask``, ``planner.approvals``) stops the
run there with ``awaiting_approval``: the log ends with the assistant message that issued it,
the calls before it have their outcomes (``result.record``), and the run goes on from that
checkpoint once a person decided (``Checkpoint.approvals``).

Everything the loop does is reported as run events (``planner.events``) through the sink of
``run_planner_loop``; its own state is the fold of those events (``planner.record.RunLog``),
and its result is that record's. A round is four named steps of ``_Run``: compact if needed
(``planner.context_window``), request the model, run the calls (``planner.execution``), and
finish (``stop``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

from planner.approvals import Approval
from planner.calls import ExecutedCall
from planner.compaction import Compactor
from planner.context_window import ContextWindow
from planner.errors import LLMError
from planner.events import (
    CallFinished,
    Checkpoint,
    Reminder,
    ReminderRole,
    ReplyJudged,
    RequestFailed,
    RequestSent,
    RoundEnded,
    RunEvent,
    RunSink,
    RunStarted,
    RunStopped,
    SentReminder,
)
from planner.execution import DEFAULT_MAX_PARALLEL_READS, ToolCallExecutor, execute_round
from planner.llm import ChatModel, CompletionRequest
from planner.messages import ChatMessage, TokenUsage, ToolCall
from planner.policy import PolicyGate
from planner.record import RunLog, RunRecord
from planner.replies import FAILED_STOP_REASONS, StopReason, judge_reply, stored_reply
from planner.resume import decided_calls, standing_for
from planner.tools import ToolContext, ToolRegistry, ToolSpec

__all__ = [
    "Checkpoint",
    "LoopState",
    "PlannerLoopInput",
    "PlannerLoopResult",
    "ReminderChannel",
    "ReminderRole",
    "StopReason",
    "format_reminder",
    "run_planner_loop",
]

logger = logging.getLogger(__name__)


class LoopState(NamedTuple):
    """What the loop knows before a request; the input of reminder producers (an immutable
    record, made every round: a NamedTuple, as the run events are).

    Attributes:
        round: the 1-based round about to run.
        tool_call_count: tool calls executed so far in this loop.
        tokens_used: usage summed over the requests so far.
        last_call: the most recent executed call, or ``None``.
        compactions_done: how many times the context was compacted so far.
        max_rounds: the round limit of this loop.
        last_round_calls: the calls of the previous round, in the order the model issued
            them (empty before the first round and after a round without calls).
    """

    round: int
    tool_call_count: int
    tokens_used: TokenUsage
    last_call: ExecutedCall | None
    compactions_done: int = 0
    max_rounds: int = 5
    last_round_calls: tuple[ExecutedCall, ...] = ()


ReminderChannel = Callable[[LoopState], Sequence[str | Reminder]]
"""``state -> reminders`` for the request about to go out: texts (sent with role ``system``,
no producer named) or ``Reminder`` values."""


@dataclass(frozen=True)
class PlannerLoopInput:
    """What configures one run of the loop (besides the model and the sink).

    Attributes:
        system_prompt: the agent's instructions (first message of the log).
        user_prompt: the mission objective (the user message after ``prior_messages``).
        tools: tools the model may call; names must be unique. A tool runs at most its
            ``ToolSpec.timeout_s`` (default ``DEFAULT_TOOL_TIMEOUT_S``, 60 s).
        prior_messages: earlier conversation placed between the system and the user message.
        max_rounds: completion requests at most (default 5, must be ≥ 1).
        model: model name passed to the ChatModel (``None`` = its default).
        reminder_channel: ``state -> reminders`` called before each request: texts, or
            ``Reminder`` values that name their producer and role (``planner.events``).
        ctx: passed to tool handlers; default ``ToolContext(user_id="local")``.
        policy: awaited before each known tool runs (``None`` allows every call).
        compactor: summarise the middle of the conversation when it nears the context (see
            ``planner.compaction``); ``None``: never.
        max_parallel_reads: read calls of one round running at once, at most (default 10,
            must be ≥ 1; 1 runs every call alone). See ``planner.execution``.
        resume: continue an earlier attempt from its checkpoint instead of starting anew
            (``system_prompt``, ``prior_messages`` and ``user_prompt`` are then in it).
    """

    system_prompt: str
    user_prompt: str
    tools: Sequence[ToolSpec] = ()
    prior_messages: Sequence[ChatMessage] = ()
    max_rounds: int = 5
    model: str | None = None
    reminder_channel: ReminderChannel | None = None
    ctx: ToolContext | None = None
    policy: PolicyGate | None = None
    compactor: Compactor | None = None
    max_parallel_reads: int = DEFAULT_MAX_PARALLEL_READS
    resume: Checkpoint | None = None

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.max_parallel_reads < 1:
            raise ValueError(f"max_parallel_reads must be >= 1, got {self.max_parallel_reads}")


@dataclass(frozen=True)
class PlannerLoopResult:
    """What one run of the loop did (its ``record``, in the shape of the core contract).

    Attributes:
        messages: the stored log: system, prior, user, then assistant and tool messages (the
            middle replaced by a summary message where the context was compacted; what was
            folded is in the ``Compacted`` events and ``record.archive``). Reminders never
            appear here.
        executed_calls: every tool call with its outcome, round by round, each round's calls
            in the order the model issued them (source order).
        rounds: completion requests made (failed ones included).
        usage: token usage summed over all requests, failed ones included when the endpoint
            reported what they cost.
        stop_reason: ``final_answer`` | ``max_rounds`` | ``llm_error`` | ``truncated`` |
            ``content_filtered`` | ``empty_answer`` | ``context_exhausted`` (see
            ``planner.replies``), or ``awaiting_approval`` (not an end: the run waits for a
            person's decision on ``record.pending_approval``).
        compactions_done: times the context was compacted in this iteration.
        compaction_errors: why compactions that were tried did not happen.
        error: why the loop failed, for a stop reason in ``FAILED_STOP_REASONS``.
        record: the whole record of the run (``planner.record``).
    """

    messages: list[ChatMessage]
    executed_calls: list[ExecutedCall]
    rounds: int
    usage: TokenUsage
    stop_reason: StopReason
    compactions_done: int = 0
    error: str | None = None
    final_answer: str | None = field(default=None)
    compaction_errors: list[str] = field(default_factory=list)
    _log: RunLog | None = field(default=None, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        """True when the stop reason is a failure (``planner.replies.FAILED_STOP_REASONS``)."""
        return self.stop_reason in FAILED_STOP_REASONS

    @cached_property
    def record(self) -> RunRecord:
        """The whole record of the run (``planner.record``), made when first asked for."""
        return self._log.snapshot() if self._log is not None else RunRecord()

    @classmethod
    def of(cls, log: RunLog) -> PlannerLoopResult:
        """The result of a finished run, from the fold of its events."""
        assert log.stop_reason is not None, "the run has not stopped"
        return cls(
            messages=list(log.messages),
            executed_calls=log.calls_so_far(),
            rounds=log.rounds,
            usage=log.usage,
            stop_reason=log.stop_reason,
            compactions_done=log.compactions_done,
            error=log.error,
            final_answer=log.final_answer,
            compaction_errors=list(log.compaction_errors),
            _log=log,
        )


@lru_cache(maxsize=256)
def format_reminder(text: str, role: ReminderRole = "system") -> ChatMessage:
    """A reminder as the message sent with one request: ``<reminder>text</reminder>`` as a
    ``system`` message (default), or a ``user`` message for endpoints whose chat templates
    refuse a system message after the first (Mistral's, Gemma's). The same text and role give
    the same (frozen) message: the last 256 are kept, as producers repeat their texts."""
    return ChatMessage(role=role, content=f"<reminder>{text}</reminder>")


async def run_planner_loop(
    inp: PlannerLoopInput,
    *,
    llm: ChatModel,
    on_tool_call: ToolCallExecutor | None = None,
    sink: RunSink | None = None,
) -> PlannerLoopResult:
    """Run the loop to completion.

    Args:
        inp: prompts, tools and limits.
        llm: the chat model.
        on_tool_call: when given, executes each allowed tool call instead of the tool's
            handler (its return value becomes the tool result).
        sink: awaited with every run event (``planner.events``) as it happens, before the
            loop goes on. Fold them with ``RunLog`` for the record of a run that is cancelled
            or interrupted.

    Returns:
        The PlannerLoopResult. LLM failures end the loop with ``stop_reason="llm_error"``
        rather than raising; tool failures are tool results.

    Raises:
        ToolRegistryError: ``inp.tools`` has a duplicate name or an invalid schema.
        RunInterrupted: the sink, the gate or a tool said the run cannot go on.
        Whatever the sink raises (other than for ``CallStarted``).
    """
    run = _Run(inp, llm, on_tool_call, sink)
    stopped = await run.start()
    if stopped is not None:
        return stopped
    for round_no in range(run.first_round, inp.max_rounds + 1):
        stopped = await run.round(round_no)
        if stopped is not None:
            return stopped
    return await run.stop(inp.max_rounds, StopReason.MAX_ROUNDS)


class _Run:
    """One run of the loop under way: its configuration, its state (the fold of its events,
    ``log``; the context's fill, ``window``) and its steps."""

    def __init__(
        self,
        inp: PlannerLoopInput,
        llm: ChatModel,
        on_tool_call: ToolCallExecutor | None,
        sink: RunSink | None,
    ) -> None:
        self.inp, self.llm, self.on_tool_call, self.sink = inp, llm, on_tool_call, sink
        self.registry = ToolRegistry(inp.tools)
        self.openai_tools = [spec.to_openai_tool() for spec in self.registry.specs()]
        self.ctx = inp.ctx or ToolContext(user_id="local")
        self.log = RunLog()
        self.window = ContextWindow(inp.compactor, self.registry.specs())
        self.head_size = 2 + len(inp.prior_messages)  # system prompt, prior, objective
        self.first_round = 1
        # approvals given before the run that a later call may use, each once
        self.standing = list(inp.resume.standing_approvals) if inp.resume else []

    async def emit(self, event: RunEvent) -> None:
        """Fold ``event`` into the log and give it to the sink."""
        self.log.apply(event)
        if self.sink is not None:
            await self.sink(event)

    async def start(self) -> PlannerLoopResult | None:
        """``RunStarted``; a resumed run first finishes the round under way when it stopped.
        Returns the result when the run stopped already."""
        inp, resume = self.inp, self.inp.resume
        if resume is None:
            head = (
                ChatMessage(role="system", content=inp.system_prompt),
                *inp.prior_messages,
                ChatMessage(role="user", content=inp.user_prompt),
            )
            self.window.count(head)
            await self.emit(RunStarted(head))
            return None
        self.window.count(resume.messages)
        if resume.context_tokens is not None:  # the larger, as after every reply
            self.window.tokens = max(self.window.tokens, resume.context_tokens)
        await self.emit(RunStarted(tuple(resume.messages), resume))
        self.first_round = resume.rounds_done + 1
        under_way = resume.pending_calls()
        if under_way:  # the round under way when the earlier attempt stopped
            settled, approved = await decided_calls(resume, under_way, self.registry, self.emit)
            reply_text = resume.messages[-1].content
            round_no = resume.rounds_done
            if not await self.run_calls(under_way, round_no, reply_text, settled, approved):
                return await self.stop(round_no, StopReason.AWAITING_APPROVAL)
        if self.first_round > inp.max_rounds:
            return await self.stop(resume.rounds_done, StopReason.MAX_ROUNDS)
        return None

    async def round(self, round_no: int) -> PlannerLoopResult | None:
        """One round: compact if needed, request the model, run the calls it asked for.
        Returns the result when the run stopped in it."""
        exhausted = await self.window.compact(round_no, self.log, self.head_size, self.emit)
        if exhausted is not None:
            return await self.stop(round_no - 1, StopReason.CONTEXT_EXHAUSTED, error=exhausted)
        reply = await self.request(round_no)
        if isinstance(reply, PlannerLoopResult):
            return reply
        if not reply.tool_calls:
            return None  # the model was told why its reply cannot stand, and asked again
        if not await self.run_calls(reply.tool_calls, round_no, reply.content):
            return await self.stop(round_no, StopReason.AWAITING_APPROVAL)
        return None

    async def request(self, round_no: int) -> ChatMessage | PlannerLoopResult:
        """Send the log with this round's reminders and judge the reply: the stored reply
        when the run goes on (with or without calls), else the result."""
        reminders = self.reminders(round_no)
        sent_messages = [format_reminder(r.text, r.role) for r in reminders]
        overflow = self.window.overflows(self.log, sent_messages)
        if overflow is not None:
            return await self.stop(round_no - 1, StopReason.CONTEXT_EXHAUSTED, error=overflow)
        # validated, not model_construct: pydantic's check of instances of the right types is
        # cheaper than its Python-level construct (2.1 against 2.9 us for 12 messages, 5 tools)
        request = CompletionRequest(
            messages=[*self.log.messages, *sent_messages],
            tools=self.openai_tools,
            model=self.inp.model,
        )
        audit = tuple([SentReminder(round_no, r.producer or "", r.text) for r in reminders])
        await self.emit(RequestSent(round_no, audit, self.window.tokens))
        try:
            response = await self.llm.complete(request)
        except LLMError as exc:
            logger.warning("llm request failed in round %d: %s", round_no, exc)
            await self.emit(RequestFailed(round_no, str(exc), exc.usage))
            return await self.stop(round_no, StopReason.LLM_ERROR, error=str(exc))
        reply = stored_reply(response)
        self.window.replied(reply, response)
        verdict = judge_reply(response, round=round_no, max_rounds=self.inp.max_rounds)
        self.window.count(verdict.follow_up)
        follow_up, stop_reason, error = tuple(verdict.follow_up), verdict.stop_reason, verdict.error
        judged = ReplyJudged(
            round_no, reply, response.usage, follow_up, stop_reason, error, self.window.tokens
        )
        await self.emit(judged)
        if stop_reason is None:
            return reply
        answer = reply.content if stop_reason == "final_answer" else None
        return await self.stop(round_no, stop_reason, error=error, final_answer=answer)

    def reminders(self, round_no: int) -> list[Reminder]:
        """What the reminder channel gives for the round about to run, as Reminder values."""
        channel, log = self.inp.reminder_channel, self.log
        if channel is None:
            return []
        state = LoopState(
            round_no,
            len(log.calls),
            log.usage,
            log.last_call,
            log.compactions_done,
            self.inp.max_rounds,
            log.last_round_calls,
        )
        return [r if isinstance(r, Reminder) else Reminder(r) for r in channel(state)]

    async def run_calls(
        self,
        calls: Sequence[ToolCall],
        round_no: int,
        reply_text: str | None,
        settled: Mapping[int, ExecutedCall] | None = None,
        approvals: Mapping[int, Approval] | None = None,
    ) -> bool:
        """Run the round's calls; False when it parked at a call waiting for approval. A
        call without an approval of its own that matches a standing approval runs with it,
        which is then used up (``Checkpoint.standing_approvals``)."""
        standing = self.standing
        if standing:
            approvals = {**standing_for(calls, standing, settled), **(approvals or {})}
        executed = await execute_round(
            calls,
            round=round_no,
            registry=self.registry,
            ctx=self.ctx,
            policy=self.inp.policy,
            executor=self.on_tool_call,
            sink=self.sink,  # the loop's own fold takes the calls from RoundEnded
            max_parallel_reads=self.inp.max_parallel_reads,
            settled=settled,
            approvals=approvals,
            reply_text=reply_text,
        )
        outcomes = executed.calls
        for outcome in outcomes:  # a standing approval that let its call run is used up
            used = approvals.get(outcome.index) if approvals else None
            if used is not None and used in standing and outcome.ran:
                standing.remove(used)
        if executed.parked is not None:  # the round waits: no RoundEnded, no results logged
            for outcome in outcomes:
                self.log.fold_call_finished(CallFinished(outcome))
            self.log.fold_approval_requested(executed.parked)
            return False
        await self.emit(RoundEnded(round_no, tuple(outcomes)))
        if outcomes:  # the tool results the fold just appended
            self.window.count(self.log.messages[-len(outcomes) :])
        return True

    async def stop(self, rounds: int, reason: StopReason, **extra: Any) -> PlannerLoopResult:
        """Finish: ``RunStopped``, and the result of the run."""
        await self.emit(RunStopped(rounds, reason, **extra))
        return PlannerLoopResult.of(self.log)
