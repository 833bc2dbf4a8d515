"""The planner loop: LLM ↔ tools over several rounds.

One round = one completion request, then the tool calls it asked for. The loop stops when the
model answers without tool calls (``final_answer``), when ``max_rounds`` rounds have run and
the model still asks for tools (``max_rounds``), or when the model cannot answer
(``llm_error``; the error is on the result, the log so far is kept). A reply that is cut,
filtered or empty is judged by ``planner.replies`` (stop reasons ``truncated``,
``content_filtered``, ``empty_answer``); those and ``llm_error`` are failures.

Reminders from ``reminder_channel`` are appended to *that request only* as
``<reminder>…</reminder>`` system messages; they never enter ``PlannerLoopResult.messages``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from planner.compaction import (
    Compaction,
    CompactionError,
    Compactor,
    compact_history,
    estimate_message_tokens,
    estimate_tokens,
    should_compact,
)
from planner.errors import LLMError
from planner.execution import (
    DEFAULT_MAX_PARALLEL_READS,
    DEFAULT_TOOL_TIMEOUT_S,
    CallJournal,
    ExecutedCall,
    ToolCallExecutor,
    execute_calls,
    tool_result_message,
)
from planner.llm import ChatModel, CompletionRequest
from planner.messages import ChatMessage, TokenUsage, ToolCall
from planner.policy import PolicyGate
from planner.replies import FAILED_STOP_REASONS, StopReason, judge_reply, stored_reply
from planner.tools import ToolContext, ToolRegistry, ToolSpec

__all__ = [
    "Checkpoint",
    "LoopState",
    "PlannerLoopInput",
    "PlannerLoopResult",
    "ReminderChannel",
    "StopReason",
    "format_reminder",
    "run_planner_loop",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopState:
    """What the loop knows before a request; the input of reminder producers.

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


ReminderChannel = Callable[[LoopState], Sequence[str]]
ReminderRole = Literal["system", "user"]


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
            ``compactions_done``); they count toward ``Compactor.max_per_iteration``.
        context_tokens: what the context held at the checkpoint, as the earlier attempt
            counted it (the provider's last usage plus estimates, or the count after a
            compaction); ``None``: estimated from the messages and tool definitions.
    """

    messages: Sequence[ChatMessage]
    rounds_done: int
    usage: TokenUsage = field(default_factory=TokenUsage)
    settled: Mapping[int, ExecutedCall] = field(default_factory=dict)
    compactions_done: int = 0
    compaction_attempts: int | None = None
    context_tokens: int | None = None

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """The calls of the round under way when the checkpoint was taken (none when the log
        does not end with an assistant message that calls tools)."""
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant":
            return ()
        return last.tool_calls


@dataclass(frozen=True)
class PlannerLoopInput:
    """Everything one run of the loop needs besides the model.

    Attributes:
        system_prompt: the agent's instructions (first message of the log).
        user_prompt: the mission objective (the user message after ``prior_messages``).
        tools: tools the model may call; names must be unique.
        prior_messages: earlier conversation placed between the system and the user message.
        max_rounds: completion requests at most (default 5, must be ≥ 1).
        model: model name passed to the ChatModel (``None`` = its default).
        reminder_channel: ``state -> texts`` called before each request.
        ctx: passed to tool handlers; default ``ToolContext(user_id="local")``.
        policy: awaited before each known tool runs (``None`` allows every call).
        temperature, max_tokens: passed through on every request.
        on_message: called with every message as it enters the stored log (the system and
            user messages first), so a caller keeps the log of a run that is cancelled.
        on_executed_call: called with every ExecutedCall as soon as it finished (in
            completion order: concurrent reads may finish out of source order).
        max_parallel_reads: read calls of one round running at once, at most (default 10,
            must be ≥ 1; 1 runs every call alone). See ``planner.execution``.
        tool_timeout_s: seconds a tool call may run when its ToolSpec sets no ``timeout_s``
            (default 60, must be > 0; ``None``: no limit).
        on_read_batch: called after each group of reads that ran concurrently, with how many
            ran (for metrics).
        journal: records ``write`` / ``destructive`` calls around their handler (see
            ``planner.execution.CallJournal``); ``None``: not recorded.
        on_round_end: awaited after each round whose calls ran, with the round number and
            its calls in source order, once their results are in the log (a checkpoint);
            what it raises propagates.
        resume: continue an earlier attempt from its checkpoint instead of starting anew
            (``system_prompt``, ``prior_messages`` and ``user_prompt`` are then in it).
        reminder_role: the role reminders are sent with (``system``, default, or ``user``).
        compactor: summarise the middle of the conversation when it nears the context (see
            ``planner.compaction``); ``None``: never.
        on_compaction: called with the round about to run and each Compaction made (its
            ``folded`` messages are what the caller archives).
        on_compaction_failed: called with the round and the CompactionError of a compaction
            that was tried and did not happen.
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
    temperature: float | None = None
    max_tokens: int | None = None
    on_message: Callable[[ChatMessage], None] | None = None
    on_executed_call: Callable[[ExecutedCall], None] | None = None
    max_parallel_reads: int = DEFAULT_MAX_PARALLEL_READS
    tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S
    on_read_batch: Callable[[int], None] | None = None
    journal: CallJournal | None = None
    on_round_end: Callable[[int, Sequence[ExecutedCall]], Awaitable[None]] | None = None
    resume: Checkpoint | None = None
    reminder_role: ReminderRole = "system"
    compactor: Compactor | None = None
    on_compaction: Callable[[int, Compaction], None] | None = None
    on_compaction_failed: Callable[[int, CompactionError], None] | None = None

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.max_parallel_reads < 1:
            raise ValueError(f"max_parallel_reads must be >= 1, got {self.max_parallel_reads}")
        if self.tool_timeout_s is not None and not self.tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s must be > 0 or None, got {self.tool_timeout_s}")


@dataclass(frozen=True)
class PlannerLoopResult:
    """What one run of the loop did.

    Attributes:
        messages: the stored log: system, prior, user, then assistant and tool messages (the
            middle replaced by a summary message where the context was compacted; what was
            folded reached ``on_compaction``). Reminders never appear here.
        executed_calls: every tool call with its outcome, round by round, each round's calls
            in the order the model issued them (source order).
        rounds: completion requests made (failed ones included).
        usage: token usage summed over all requests, failed ones included when the endpoint
            reported what they cost.
        stop_reason: ``final_answer`` | ``max_rounds`` | ``llm_error`` | ``truncated`` |
            ``content_filtered`` | ``empty_answer`` | ``context_exhausted`` (see
            ``planner.replies``).
        compactions_done: times the context was compacted in this iteration.
        compaction_errors: why compactions that were tried did not happen.
        error: why the loop failed, for a stop reason in ``FAILED_STOP_REASONS``.
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

    @property
    def failed(self) -> bool:
        """True when the stop reason is a failure (``planner.replies.FAILED_STOP_REASONS``)."""
        return self.stop_reason in FAILED_STOP_REASONS


def format_reminder(text: str, role: ReminderRole = "system") -> ChatMessage:
    """A reminder as the message sent with one request: ``<reminder>text</reminder>`` as a
    ``system`` message (default), or a ``user`` message for endpoints whose chat templates
    refuse a system message after the first (Mistral's, Gemma's)."""
    return ChatMessage(role=role, content=f"<reminder>{text}</reminder>")


async def run_planner_loop(
    inp: PlannerLoopInput,
    *,
    llm: ChatModel,
    on_tool_call: ToolCallExecutor | None = None,
) -> PlannerLoopResult:
    """Run the loop to completion.

    Args:
        inp: prompts, tools and limits.
        llm: the chat model.
        on_tool_call: when given, executes each allowed tool call instead of the tool's
            handler (its return value becomes the tool result).

    Returns:
        The PlannerLoopResult. LLM failures end the loop with ``stop_reason="llm_error"``
        rather than raising; tool failures are tool results.

    Raises:
        ToolRegistryError: ``inp.tools`` has a duplicate name or an invalid schema.
    """
    registry = ToolRegistry(inp.tools)
    openai_tools = [spec.to_openai_tool() for spec in registry.specs()]
    ctx = inp.ctx or ToolContext(user_id="local")
    messages: list[ChatMessage] = []
    executed: list[ExecutedCall] = []

    compactor = inp.compactor
    # what the next request holds (tracked only with a compactor): the tool definitions until
    # the provider reports what it read, then its count plus estimates of what was appended
    context_tokens = estimate_tokens(json.dumps(openai_tools)) if compactor and openai_tools else 0

    def log(message: ChatMessage) -> None:
        nonlocal context_tokens
        messages.append(message)
        if compactor is not None:
            context_tokens += estimate_message_tokens(message)
        if inp.on_message is not None:
            inp.on_message(message)

    async def run_calls(
        calls: Sequence[ToolCall],
        round_no: int,
        settled: Mapping[int, ExecutedCall] | None = None,
    ) -> tuple[ExecutedCall, ...]:
        outcomes = await execute_calls(
            calls,
            round=round_no,
            registry=registry,
            ctx=ctx,
            policy=inp.policy,
            executor=on_tool_call,
            on_executed=inp.on_executed_call,
            max_parallel_reads=inp.max_parallel_reads,
            tool_timeout_s=inp.tool_timeout_s,
            on_read_batch=inp.on_read_batch,
            journal=inp.journal,
            settled=settled,
        )
        executed.extend(outcomes)
        for outcome in outcomes:
            log(tool_result_message(outcome))
        if inp.on_round_end is not None:
            await inp.on_round_end(round_no, outcomes)
        return tuple(outcomes)

    usage = TokenUsage()
    last_round: tuple[ExecutedCall, ...] = ()
    first_round = 1
    if inp.resume is None:
        log(ChatMessage(role="system", content=inp.system_prompt))
        for message in inp.prior_messages:
            log(message)
        log(ChatMessage(role="user", content=inp.user_prompt))
    else:
        for message in inp.resume.messages:
            log(message)
        if inp.resume.context_tokens is not None:  # the larger, as after every reply
            context_tokens = max(context_tokens, inp.resume.context_tokens)
        usage = inp.resume.usage
        first_round = inp.resume.rounds_done + 1
        pending = inp.resume.pending_calls()
        if pending:  # the round under way when the earlier attempt stopped
            last_round = await run_calls(pending, inp.resume.rounds_done, inp.resume.settled)
        if first_round > inp.max_rounds:
            rounds = inp.resume.rounds_done
            return PlannerLoopResult(messages, executed, rounds, usage, "max_rounds")

    head_size = 2 + len(inp.prior_messages)  # system prompt, prior messages, objective
    compactions_done = inp.resume.compactions_done if inp.resume is not None else 0
    compaction_attempts = compactions_done
    if inp.resume is not None and inp.resume.compaction_attempts is not None:
        compaction_attempts = max(compactions_done, inp.resume.compaction_attempts)
    compaction_errors: list[str] = []

    def result(rounds: int, stop: StopReason, **extra: Any) -> PlannerLoopResult:
        return PlannerLoopResult(
            messages,
            executed,
            rounds,
            usage,
            stop,
            compactions_done=compactions_done,
            compaction_errors=compaction_errors,
            **extra,
        )

    def exhausted(round_no: int, why: str) -> PlannerLoopResult:
        assert compactor is not None
        last = (
            f"; the last compaction attempt: {compaction_errors[-1]}" if compaction_errors else ""
        )
        threshold = int(compactor.threshold * compactor.max_ctx)
        return result(
            round_no - 1,
            "context_exhausted",
            error=(
                f"the conversation holds about {context_tokens} tokens of the "
                f"{compactor.max_ctx}-token context (compaction starts at "
                f"{compactor.threshold:.0%}, {threshold} tokens), {why}{last}"
            ),
        )

    for round_no in range(first_round, inp.max_rounds + 1):
        if compactor is not None and should_compact(
            context_tokens, compactor.max_ctx, compactor.threshold
        ):
            if compaction_attempts >= compactor.max_per_iteration:
                return exhausted(
                    round_no,
                    f"after {compaction_attempts} compaction attempt(s) (at most "
                    f"{compactor.max_per_iteration} per iteration)",
                )
            compaction_attempts += 1
            compactions_before = compactions_done
            try:
                compaction = await compact_history(
                    messages,
                    llm=compactor.llm,
                    model=compactor.model,
                    keep_recent=compactor.keep_recent_tokens or compactor.max_ctx // 4,
                    max_input_tokens=compactor.summariser_max_ctx or compactor.max_ctx,
                    head=head_size,
                )
            except CompactionError as exc:
                usage = usage + exc.usage
                repeated = str(exc) in compaction_errors
                if exc.reason == "nothing_to_fold":  # no summariser asked: no attempt spent
                    compaction_attempts -= 1
                if not (repeated and exc.reason == "nothing_to_fold"):
                    logger.warning("compaction before round %d failed: %s", round_no, exc)
                    compaction_errors.append(str(exc))
                    if inp.on_compaction_failed is not None:
                        inp.on_compaction_failed(round_no, exc)
            else:
                messages[:] = compaction.messages
                usage = usage + compaction.usage
                compactions_done += 1
                # what the context held, less what the summary saved: the part no message
                # shows (tool definitions, the provider's framing) stays counted
                saved = compaction.tokens_before - compaction.tokens_after
                compaction = dataclasses.replace(
                    compaction,
                    tokens_before=context_tokens,
                    tokens_after=max(0, context_tokens - saved),
                )
                context_tokens = compaction.tokens_after
                if inp.on_compaction is not None:
                    inp.on_compaction(round_no, compaction)
            if context_tokens >= compactor.max_ctx:  # the request could not fit at all
                return exhausted(
                    round_no,
                    "more than the whole context even after compacting"
                    if compactions_done > compactions_before
                    else "more than the whole context, and compacting could not help",
                )
        state = LoopState(
            round=round_no,
            tool_call_count=len(executed),
            tokens_used=usage,
            last_call=executed[-1] if executed else None,
            compactions_done=compactions_done,
            max_rounds=inp.max_rounds,
            last_round_calls=last_round,
        )
        last_round = ()  # a round that ends without calls leaves none for the next one
        reminders = [
            format_reminder(r, inp.reminder_role)
            for r in (inp.reminder_channel(state) if inp.reminder_channel else ())
        ]
        if compactor is not None:
            sent = context_tokens + sum(estimate_message_tokens(m) for m in reminders)
            if sent >= compactor.max_ctx:  # with this round's reminders it cannot fit
                return exhausted(
                    round_no, "and with this round's reminders the request would not fit"
                )
        request = CompletionRequest(
            messages=[*messages, *reminders],
            tools=openai_tools,
            model=inp.model,
            temperature=inp.temperature,
            max_tokens=inp.max_tokens,
        )
        try:
            response = await llm.complete(request)
        except LLMError as exc:
            logger.warning("llm request failed in round %d: %s", round_no, exc)
            usage = usage + exc.usage
            return result(round_no, "llm_error", error=str(exc))
        usage = usage + response.usage
        reply = stored_reply(response)
        log(reply)
        if compactor is not None and response.usage.prompt_tokens and not response.usage.estimated:
            # the larger of the provider's count (what it read and wrote: exact where the
            # estimate drifts) and the estimate: endpoints with prompt caching report only the
            # uncached part (ollama/ollama#5370), and trusting them alone never compacts;
            # messages appended from now on add their estimate (O(1) per round)
            context_tokens = max(context_tokens, response.usage.total_tokens)
        verdict = judge_reply(response, round=round_no, max_rounds=inp.max_rounds)
        for message in verdict.follow_up:
            log(message)
        if verdict.stop_reason is not None:
            answer = reply.content if verdict.stop_reason == "final_answer" else None
            return result(round_no, verdict.stop_reason, error=verdict.error, final_answer=answer)
        if not reply.tool_calls:
            continue  # the model was told why its reply cannot stand, and asked again
        last_round = await run_calls(reply.tool_calls, round_no)

    return result(inp.max_rounds, "max_rounds")
