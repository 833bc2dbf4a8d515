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
and its result is that record's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

from planner.approvals import Approval
from planner.calls import ExecutedCall, denial_text
from planner.compaction import (
    CompactionError,
    Compactor,
    compact_history,
    estimate_message_tokens,
    should_compact,
)
from planner.errors import LLMError
from planner.events import (
    ApprovalDecided,
    CallFinished,
    Checkpoint,
    Compacted,
    CompactionFailed,
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
from planner.policy import (
    DecisionReason,
    PolicyDecision,
    PolicyGate,
    PolicyMode,
    PolicyVerdict,
)
from planner.record import RunLog, RunRecord
from planner.replies import FAILED_STOP_REASONS, StopReason, judge_reply, stored_reply
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
        sink: gets every run event (``planner.events``) as it happens; an awaitable it
            returns is awaited before the loop goes on. Fold them with ``RunLog`` for the
            record of a run that is cancelled or interrupted.

    Returns:
        The PlannerLoopResult. LLM failures end the loop with ``stop_reason="llm_error"``
        rather than raising; tool failures are tool results.

    Raises:
        ToolRegistryError: ``inp.tools`` has a duplicate name or an invalid schema.
        RunInterrupted: the sink, the gate or a tool said the run cannot go on.
        Whatever the sink raises (other than for ``CallStarted``).
    """
    registry = ToolRegistry(inp.tools)
    openai_tools = [spec.to_openai_tool() for spec in registry.specs()]
    ctx = inp.ctx or ToolContext(user_id="local")
    log = RunLog()  # the loop's state: the fold of its own events

    emit: Callable[[RunEvent], Awaitable[None] | None]
    if sink is None:
        emit = log.apply  # nothing else listens: the fold alone
    else:

        def emit(event: RunEvent) -> Awaitable[None] | None:
            """Fold ``event`` and give it to the sink; what to await, if anything (a sync
            sink costs no coroutine: the loop runs this for every event)."""
            log.apply(event)
            return sink(event)

    compactor = inp.compactor
    # what the next request holds (tracked only with a compactor): the tool definitions until
    # the provider reports what it read, then the larger of its count and the estimate, plus
    # estimates of what was appended since
    context_tokens = _tools_tokens(registry.specs()) if compactor and openai_tools else 0

    def counted(messages: Sequence[ChatMessage]) -> None:
        nonlocal context_tokens
        if compactor is not None:
            for message in messages:
                context_tokens += estimate_message_tokens(message)

    async def run_calls(
        calls: Sequence[ToolCall],
        round_no: int,
        reply_text: str | None,
        settled: Mapping[int, ExecutedCall] | None = None,
        approvals: Mapping[int, Approval] | None = None,
    ) -> bool:
        """Run the round's calls; False when it parked at a call waiting for approval. A
        call without an approval of its own that matches a standing approval runs with it,
        which is then used up (``Checkpoint.standing_approvals``)."""
        if standing:
            approvals = {**_standing_for(calls, standing, settled), **(approvals or {})}
        executed = await execute_round(
            calls,
            round=round_no,
            registry=registry,
            ctx=ctx,
            policy=inp.policy,
            executor=on_tool_call,
            sink=sink,  # the loop's own fold takes the calls from RoundEnded
            max_parallel_reads=inp.max_parallel_reads,
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
                log.fold_call_finished(CallFinished(outcome))
            log.fold_approval_requested(executed.parked)
            return False
        ended = RoundEnded(round_no, tuple(outcomes))
        log.fold_round_ended(ended)
        if compactor is not None and outcomes:  # the tool results the fold just appended
            counted(log.messages[-len(outcomes) :])
        if sink is not None and (pending := sink(ended)) is not None:
            await pending
        return True

    async def stop(rounds: int, reason: StopReason, **extra: Any) -> PlannerLoopResult:
        if (pending := emit(RunStopped(rounds, reason, **extra))) is not None:
            await pending
        return PlannerLoopResult.of(log)

    first_round = 1
    resume = inp.resume
    standing = list(resume.standing_approvals) if resume is not None else []
    if resume is None:
        head = (
            ChatMessage(role="system", content=inp.system_prompt),
            *inp.prior_messages,
            ChatMessage(role="user", content=inp.user_prompt),
        )
        counted(head)
        if (pending := emit(RunStarted(head))) is not None:
            await pending
    else:
        counted(resume.messages)
        if resume.context_tokens is not None:  # the larger, as after every reply
            context_tokens = max(context_tokens, resume.context_tokens)
        if (pending := emit(RunStarted(tuple(resume.messages), resume))) is not None:
            await pending
        first_round = resume.rounds_done + 1
        under_way = resume.pending_calls()
        if under_way:  # the round under way when the earlier attempt stopped
            settled, approved = await _decided(resume, under_way, registry, emit)
            reply_text = resume.messages[-1].content
            if not await run_calls(under_way, resume.rounds_done, reply_text, settled, approved):
                return await stop(resume.rounds_done, StopReason.AWAITING_APPROVAL)
        if first_round > inp.max_rounds:
            return await stop(resume.rounds_done, StopReason.MAX_ROUNDS)

    head_size = 2 + len(inp.prior_messages)  # system prompt, prior messages, objective

    async def exhausted(round_no: int, why: str) -> PlannerLoopResult:
        assert compactor is not None
        errors = log.compaction_errors
        last = f"; the last compaction attempt: {errors[-1]}" if errors else ""
        threshold = int(compactor.threshold * compactor.max_ctx)
        return await stop(
            round_no - 1,
            StopReason.CONTEXT_EXHAUSTED,
            error=(
                f"the conversation holds about {context_tokens} tokens of the "
                f"{compactor.max_ctx}-token context (compaction starts at "
                f"{compactor.threshold:.0%}, {threshold} tokens), {why}{last}"
            ),
        )

    channel, max_rounds = inp.reminder_channel, inp.max_rounds
    for round_no in range(first_round, max_rounds + 1):
        if compactor is not None and should_compact(
            context_tokens, compactor.max_ctx, compactor.threshold
        ):
            attempts = log.compaction_attempts
            if attempts >= compactor.max_per_iteration:
                return await exhausted(
                    round_no,
                    f"after {attempts} compaction attempt(s) (at most "
                    f"{compactor.max_per_iteration} per iteration)",
                )
            compactions_before = log.compactions_done
            try:
                compaction = await compact_history(
                    log.messages,
                    llm=compactor.llm,
                    model=compactor.model,
                    keep_recent=compactor.keep_recent_tokens or compactor.max_ctx // 4,
                    max_input_tokens=compactor.summariser_max_ctx or compactor.max_ctx,
                    head=head_size,
                )
            except CompactionError as exc:
                repeated = str(exc) in log.compaction_errors
                if not (repeated and exc.reason == "nothing_to_fold"):
                    logger.warning("compaction before round %d failed: %s", round_no, exc)
                    if (pending := emit(CompactionFailed(round_no, exc))) is not None:
                        await pending
            else:
                # what the context held, less what the summary saved: the part no message
                # shows (tool definitions, the provider's framing) stays counted
                saved = compaction.tokens_before - compaction.tokens_after
                compaction = dataclasses.replace(
                    compaction,
                    tokens_before=context_tokens,
                    tokens_after=max(0, context_tokens - saved),
                )
                context_tokens = compaction.tokens_after
                if (pending := emit(Compacted(round_no, compaction))) is not None:
                    await pending
            if context_tokens >= compactor.max_ctx:  # the request could not fit at all
                return await exhausted(
                    round_no,
                    "more than the whole context even after compacting"
                    if log.compactions_done > compactions_before
                    else "more than the whole context, and compacting could not help",
                )
        reminders: list[Reminder] = []
        if channel is not None:
            state = LoopState(
                round_no,
                len(log.calls),
                log.usage,
                log.last_call,
                log.compactions_done,
                max_rounds,
                log.last_round_calls,
            )
            reminders = _reminders(channel, state)
        if reminders:
            sent_messages = [format_reminder(r.text, r.role) for r in reminders]
            messages = [*log.messages, *sent_messages]
            audit = tuple([SentReminder(round_no, r.producer or "", r.text) for r in reminders])
        else:
            sent_messages = []
            messages = list(log.messages)
            audit = ()
        if compactor is not None:
            sent = context_tokens
            for message in sent_messages:
                sent += estimate_message_tokens(message)
            if sent >= compactor.max_ctx:  # with this round's reminders it cannot fit
                return await exhausted(
                    round_no, "and with this round's reminders the request would not fit"
                )
        # validated, not model_construct: pydantic's check of instances of the right types is
        # cheaper than its Python-level construct (2.1 against 2.9 us for 12 messages, 5 tools)
        request = CompletionRequest(messages=messages, tools=openai_tools, model=inp.model)
        sent_event = RequestSent(round_no, audit, context_tokens)
        log.fold_request_sent(sent_event)
        if sink is not None and (pending := sink(sent_event)) is not None:
            await pending
        try:
            response = await llm.complete(request)
        except LLMError as exc:
            logger.warning("llm request failed in round %d: %s", round_no, exc)
            if (pending := emit(RequestFailed(round_no, str(exc), exc.usage))) is not None:
                await pending
            return await stop(round_no, StopReason.LLM_ERROR, error=str(exc))
        reply = stored_reply(response)
        if compactor is not None:
            context_tokens += estimate_message_tokens(reply)
        if compactor is not None and response.usage.prompt_tokens and not response.usage.estimated:
            # the larger of the provider's count (what it read and wrote: exact where the
            # estimate drifts) and the estimate: endpoints with prompt caching report only the
            # uncached part (ollama/ollama#5370), and trusting them alone never compacts;
            # messages appended from now on add their estimate (O(1) per round)
            context_tokens = max(context_tokens, response.usage.total_tokens)
        verdict = judge_reply(response, round=round_no, max_rounds=inp.max_rounds)
        if compactor is not None and verdict.follow_up:
            counted(verdict.follow_up)
        judged = ReplyJudged(
            round_no,
            reply,
            response.usage,
            tuple(verdict.follow_up),
            verdict.stop_reason,
            verdict.error,
            context_tokens,
        )
        log.fold_reply_judged(judged)
        if sink is not None and (pending := sink(judged)) is not None:
            await pending
        if verdict.stop_reason is not None:
            answer = reply.content if verdict.stop_reason == "final_answer" else None
            return await stop(
                round_no, verdict.stop_reason, error=verdict.error, final_answer=answer
            )
        if not reply.tool_calls:
            continue  # the model was told why its reply cannot stand, and asked again
        if not await run_calls(reply.tool_calls, round_no, reply.content):
            return await stop(round_no, StopReason.AWAITING_APPROVAL)

    return await stop(inp.max_rounds, StopReason.MAX_ROUNDS)


async def _decided(
    resume: Checkpoint,
    calls: Sequence[ToolCall],
    registry: ToolRegistry,
    emit: Callable[[RunEvent], Awaitable[None] | None],
) -> tuple[dict[int, ExecutedCall], dict[int, Approval]]:
    """The pending round's results known before it goes on (``resume.settled``, plus the
    refusals of the calls a person denied or nobody approved in time, and of approved calls
    whose tool is no longer offered), and the granted approvals of the calls that run now;
    reports every decision found (``ApprovalDecided``)."""
    settled = dict(resume.settled)
    approved: dict[int, Approval] = {}
    round_no = resume.rounds_done
    for position, approval in sorted(resume.approvals.items()):
        if position in settled or not 0 <= position < len(calls) or not approval.decided:
            continue  # already settled (it ran), or still pending: the gate asks again
        call = calls[position]
        if (pending := emit(ApprovalDecided(round_no, position, call, approval))) is not None:
            await pending
        if approval.granted and call.name in registry:
            approved[position] = approval
            continue
        reason: str
        if approval.granted:
            reason, message, reminder = (
                DecisionReason.TOOL_NOT_OFFERED,
                f"{call.name} was {approval.describe()}, but this agent no longer offers "
                f"{call.name}; it was not run",
                f"{call.name} is no longer available; do not call it again.",
            )
        else:
            reason, message, reminder = approval.refusal()
        decision = PolicyDecision(
            allow=False,
            reason=reason,
            verdict=PolicyVerdict.DENY,
            mode=PolicyMode.ENFORCE,
            message=message,
            reminder=reminder,
        )
        error = message if approval.granted else denial_text(decision)
        settled[position] = ExecutedCall(round_no, call, None, error, decision, index=position)
    return settled, approved


def _standing_for(
    calls: Sequence[ToolCall],
    standing: Sequence[Approval],
    settled: Mapping[int, ExecutedCall] | None,
) -> dict[int, Approval]:
    """The standing approvals that go with ``calls``, by position: each to the first call not
    settled already whose tool and arguments it was given for (``Approval.matches``), at most
    once."""
    given: dict[int, Approval] = {}
    left = list(standing)
    for position, call in enumerate(calls):
        if settled and position in settled:
            continue
        match = next((a for a in left if a.matches(call)), None)
        if match is not None:
            given[position] = match
            left.remove(match)
    return given


def _tools_tokens(specs: Sequence[ToolSpec]) -> int:
    """``estimate_tokens(json.dumps(openai_tools))`` of these tools' definitions, from each
    tool's JSON size (``ToolSpec.openai_tool_chars``): the list's text is its items' joined
    by ``", "`` in brackets."""
    chars = 2 + 2 * (len(specs) - 1) + sum(spec.openai_tool_chars for spec in specs)
    return (chars + 3) // 4


def _reminders(channel: ReminderChannel, state: LoopState) -> list[Reminder]:
    """What ``channel`` gives for ``state``, as Reminder values."""
    return [r if isinstance(r, Reminder) else Reminder(r) for r in channel(state)]
