"""Compaction: when a conversation nears the model's context, summarise its middle.

``should_compact`` says when (the context reaches ``threshold``, 92 %, of ``max_ctx``
tokens); ``compact_history`` does it: it keeps verbatim the *head* (system prompt, prior
messages and the mission objective: everything up to the first user message) and the most
recent turns (``keep_recent_tokens``, default a quarter of the context; when every turn fits
that budget, all but the last are folded), sends the middle to a
chat model with a summarisation prompt (facts found, decisions made, open items, results still
needed), checks the answer, and returns the new message list with the summary spliced in as
one ``user`` message that says it stands for N folded turns, plus everything folded, verbatim
(the caller archives it: nothing is lost).

Split points: a turn is an assistant message with the tool results that answer it (and any
note the loop added after it); the middle starts right after the head and ends right before an
assistant message, so a tool call is never separated from its result, parallel batches
included.

Tokens are estimated at 4 characters per token plus 4 per message (OpenAI's rule of thumb,
https://help.openai.com/en/articles/4936856), the same rule the providers use when an endpoint
does not report usage; no tokenizer is downloaded.

The model of the split and of the prompt: LangChain's summarization middleware
(``langchain/agents/middleware/summarization.py``), which also refuses to cut between an AI
message and its tool messages.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from planner.errors import LLMError, PlannerError
from planner.json_text import json_text
from planner.llm import ChatModel, CompletionRequest, CompletionResponse
from planner.messages import ChatMessage, TokenUsage
from planner.replies import answer_text

__all__ = [
    "COMPACT_THRESHOLD",
    "SUMMARY_PROMPT",
    "Compaction",
    "CompactionError",
    "Compactor",
    "compact_history",
    "estimate_message_tokens",
    "estimate_tokens",
    "restore",
    "should_compact",
    "split_points",
    "summary_message",
]

COMPACT_THRESHOLD = 0.92
"""Share of the context from which the middle is summarised (the seed design's 92 %)."""

SUMMARY_PROMPT = (
    "You compress part of an AI agent's working conversation so that the agent can go on "
    "without it. The agent keeps its instructions, its objective and its latest turns; you "
    "get the turns in between. Write a summary for the agent with four short sections:\n"
    "Facts found: what the tools returned that still matters (ids, names, numbers, dates and "
    "quotes verbatim).\n"
    "Decisions made: what was decided or done (notes created, messages sent, ...).\n"
    "Open items: what was started and not finished.\n"
    "Results still needed: what the objective still needs.\n"
    "Write plain text, no preamble. Do not invent anything that is not in the turns."
)

_M = TypeVar("_M")

_SUMMARY_PREFIX = "<summary of {turns} earlier turn(s), folded to fit the context>"
_SUMMARY_SUFFIX = "</summary>"


def should_compact(
    tokens_in_context: int, max_ctx: int, threshold: float = COMPACT_THRESHOLD
) -> bool:
    """True when ``tokens_in_context`` reached ``threshold`` of ``max_ctx`` (``max_ctx`` ≤ 0
    turns compaction off)."""
    return max_ctx > 0 and tokens_in_context >= threshold * max_ctx


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` at 4 characters per token, rounded up (see the module docstring)."""
    return (len(text) + 3) // 4


def estimate_message_tokens(message: ChatMessage) -> int:
    """Tokens of one message as sent: its text and tool calls, plus 4 for the framing."""
    size = len(message.content or "")
    for call in message.tool_calls:
        size += len(call.name) + len(json_text(call.arguments))
    return (size + 3) // 4 + 4


class CompactionError(PlannerError):
    """Compaction did not happen; nothing changed. ``reason`` is a code for metrics:
    ``nothing_to_fold`` (fewer than two turns after the head), ``llm_error`` (the summariser
    failed), ``unusable_summary`` (empty, only reasoning, tool calls, cut off, filtered, or not
    shorter than what it would replace). ``usage``:
    what the summariser's request cost anyway; ``tokens_before``: the estimated tokens of the
    conversation it was to compact; ``duration_ms``: the summariser's wall time (0 when it
    was not asked)."""

    def __init__(
        self,
        reason: str,
        message: str,
        usage: TokenUsage | None = None,
        *,
        tokens_before: int = 0,
        duration_ms: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.usage = usage or TokenUsage()
        self.tokens_before = tokens_before
        self.duration_ms = duration_ms


@dataclass(frozen=True)
class Compactor:
    """How a loop compacts its context (``PlannerLoopInput.compactor``).

    Attributes:
        llm: the summariser (may be the mission's own model, or a cheaper one).
        max_ctx: the mission model's context in tokens (> 0).
        model: the summariser's model name (``None``: its default).
        threshold: share of ``max_ctx`` that triggers a compaction (default 0.92).
        max_per_iteration: compactions tried per iteration, failed ones included (default 1);
            crossing the threshold again after that ends the run with ``context_exhausted``.
        keep_recent_tokens: tokens of the latest turns kept verbatim (default: a quarter of
            ``max_ctx``; the last turn is always kept).
        summariser_max_ctx: the summariser's own context in tokens (default ``max_ctx``): the
            middle sent to it is trimmed (oldest first) to fit.
    """

    llm: ChatModel
    max_ctx: int
    model: str | None = None
    threshold: float = COMPACT_THRESHOLD
    max_per_iteration: int = 1
    keep_recent_tokens: int | None = None
    summariser_max_ctx: int | None = None

    def __post_init__(self) -> None:
        if self.max_ctx <= 0:
            raise ValueError(f"max_ctx must be > 0, got {self.max_ctx}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.max_per_iteration < 1:
            raise ValueError(f"max_per_iteration must be >= 1, got {self.max_per_iteration}")


@dataclass(frozen=True)
class Compaction:
    """One compaction: the new log and what it folded.

    Attributes:
        messages: the new message list: head, the summary message, the recent turns.
        folded: the messages taken out, verbatim, in order (``messages_before[start:end]``).
        start, end: the folded slice of the old list; the summary message sits at ``start``
            in the new one (``restore`` puts ``folded`` back there).
        summary: the summary text the model will read.
        folded_turns: assistant turns folded.
        tokens_before, tokens_after: estimated tokens of the old and the new list (the loop
            replaces them with its own count of the context, which includes what no message
            shows: tool definitions, the provider's framing).
        model: the summariser's model name, as asked.
        duration_ms: wall time of the summarisation.
        usage: tokens the summarisation cost.
    """

    messages: list[ChatMessage]
    folded: list[ChatMessage]
    start: int
    end: int
    summary: str
    folded_turns: int
    tokens_before: int
    tokens_after: int
    model: str | None
    duration_ms: float
    usage: TokenUsage = field(default_factory=TokenUsage)


def split_points(messages: Sequence[ChatMessage], head: int | None = None) -> tuple[int, list[int]]:
    """``(head_end, cuts)``: the head is ``messages[:head_end]`` (``head`` messages when
    given: the loop passes system prompt + prior messages + objective; else up to and
    including the first user message); ``cuts`` are the indices after the head where a turn
    starts (an assistant message), so cutting there separates no tool call from its result."""
    if head is None:
        head = next((i + 1 for i, m in enumerate(messages) if m.role == "user"), len(messages))
    head_end = min(head, len(messages))
    cuts = [i for i in range(head_end, len(messages)) if messages[i].role == "assistant"]
    return head_end, cuts


def summary_message(summary: str, turns: int) -> ChatMessage:
    """The message that stands for the folded turns in the log the model reads."""
    return ChatMessage(
        role="user",
        content=f"{_SUMMARY_PREFIX.format(turns=turns)}\n{summary.strip()}\n{_SUMMARY_SUFFIX}",
    )


def restore(messages: Sequence[_M], folds: Sequence[tuple[int, Sequence[_M]]]) -> list[_M]:
    """The conversation before compaction: ``folds`` are ``(start, folded)`` of each compaction
    in the order they happened; each summary message at ``start`` is replaced by what it
    folded, the latest compaction first. ``restore(c.messages, [(c.start, c.folded)])`` is the
    list ``c`` was made from. Messages may be ChatMessages or their stored JSON form.

    Raises:
        ValueError: a ``start`` lies outside the list it applies to (the archive does not
            belong to this log).
    """
    restored = list(messages)
    for start, folded in reversed(folds):
        if not 0 <= start < len(restored):
            raise ValueError(f"no summary message at {start}: the log has {len(restored)}")
        restored[start : start + 1] = list(folded)
    return restored


async def compact_history(
    messages: Sequence[ChatMessage],
    *,
    llm: ChatModel,
    model: str | None,
    keep_recent: int,
    max_input_tokens: int | None = None,
    head: int | None = None,
) -> Compaction:
    """Fold the middle of ``messages`` into a summary (see the module docstring).

    Args:
        messages: the conversation (head, then turns).
        llm: the summariser.
        model: its model name (``None``: its default).
        keep_recent: tokens of the latest turns to keep verbatim; the last turn always stays.
        max_input_tokens: the summariser's context; a quarter of it (at most 4,096 tokens) is
            left for its answer (the request's ``max_tokens``), and the middle it reads is
            trimmed to fit the rest, oldest messages first (all of them are still folded and
            archived).
        head: how many messages form the head (system prompt, prior messages, objective);
            default: up to and including the first user message.

    Raises:
        CompactionError: nothing to fold, the summariser failed, or its summary is unusable;
            ``messages`` is then to be used as it is.
    """
    sizes = [estimate_message_tokens(m) for m in messages]
    tokens_before = sum(sizes)
    start, end = _fold_span(messages, head, sizes, keep_recent)
    folded = list(messages[start:end])
    turns = sum(1 for m in folded if m.role == "assistant")
    started = time.perf_counter()
    try:
        response = await llm.complete(_summary_request(folded, model, max_input_tokens))
    except LLMError as exc:
        message = f"the summariser failed: {exc}"
        raise _failure("llm_error", message, exc.usage, tokens_before, started) from exc
    folded_tokens = sum(sizes[start:end])
    problem = _unusable(response, folded_tokens)
    if problem is not None:
        raise _failure("unusable_summary", problem, response.usage, tokens_before, started)
    summary = answer_text(response.message.content)  # reasoning blocks are not a summary
    # an earlier summary folded again stands for its own turns too
    represented = turns + sum(_summarised_turns(m) for m in folded if m.role == "user")
    spliced = summary_message(summary, represented)
    return Compaction(
        messages=[*messages[:start], spliced, *messages[end:]],
        folded=folded,
        start=start,
        end=end,
        summary=summary,
        folded_turns=turns,
        tokens_before=tokens_before,
        tokens_after=tokens_before - folded_tokens + estimate_message_tokens(spliced),
        model=model,
        duration_ms=(time.perf_counter() - started) * 1000.0,
        usage=response.usage,
    )


def _summary_request(
    folded: Sequence[ChatMessage], model: str | None, max_input_tokens: int | None
) -> CompletionRequest:
    """The summariser's request: the summary prompt and the folded turns, fitted."""
    return CompletionRequest(
        messages=[
            ChatMessage(role="system", content=SUMMARY_PROMPT),
            ChatMessage(role="user", content=_render(folded, max_input_tokens)),
        ],
        tools=[],
        model=model,
        max_tokens=_output_tokens(max_input_tokens),
    )


def _failure(
    reason: str, message: str, usage: TokenUsage, tokens_before: int, started: float
) -> CompactionError:
    """The ``CompactionError`` of a compaction that began at ``started`` (perf_counter)."""
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    return CompactionError(
        reason, message, usage, tokens_before=tokens_before, duration_ms=elapsed_ms
    )


def _fold_span(
    messages: Sequence[ChatMessage], head: int | None, sizes: Sequence[int], keep_recent: int
) -> tuple[int, int]:
    """``(start, end)`` of the messages to fold: after the head, up to the latest whole turns
    that fit ``keep_recent`` tokens (the last turn always stays).

    Raises:
        CompactionError: fewer than two turns (nothing to fold).
    """
    head_end, cuts = split_points(messages, head)
    if len(cuts) < 2:
        raise CompactionError(
            "nothing_to_fold", "fewer than two turns: nothing to fold", tokens_before=sum(sizes)
        )
    end = cuts[-1]
    for cut in reversed(cuts[:-1]):
        if sum(sizes[cut:]) > keep_recent:
            break
        end = cut
    if end == head_end:
        # every turn fits the budget, yet the context is full (a long head, tool schemas):
        # fold all but the last turn rather than nothing
        end = cuts[-1]
    return head_end, end


def _unusable(response: CompletionResponse, folded_tokens: int) -> str | None:
    """Why the summariser's answer cannot replace ``folded_tokens`` tokens, or ``None``."""
    if response.finish_reason in _UNUSABLE_FINISH:
        return (
            f"the summariser's answer was {_UNUSABLE_FINISH[response.finish_reason]} "
            f"(finish_reason {response.finish_reason!r})"
        )
    summary = answer_text(response.message.content)
    if response.message.tool_calls or not summary:
        return "the summariser answered no summary text"
    if estimate_tokens(summary) >= folded_tokens:
        return (
            f"the summary ({estimate_tokens(summary)} tokens) is not shorter than what it "
            f"would replace ({folded_tokens} tokens)"
        )
    return None


_SUMMARY_OF = re.compile(r"^<summary of (\d+) earlier turn\(s\)")


def _summarised_turns(message: ChatMessage) -> int:
    """The turns an earlier summary message stands for (0 for any other message)."""
    found = _SUMMARY_OF.match(message.content or "")
    return int(found.group(1)) if found else 0


_UNUSABLE_FINISH = {
    "length": "cut off at its token limit",
    "content_filter": "filtered",
    "error": "an error",
}

SUMMARY_OUTPUT_SHARE = 0.25
"""Share of the summariser's context left for its answer (the rest holds the turns to read);
the request's ``max_tokens`` is that share, at most ``SUMMARY_MAX_TOKENS``."""

SUMMARY_MAX_TOKENS = 4096


def _output_tokens(max_input_tokens: int | None) -> int | None:
    if max_input_tokens is None:
        return None
    return max(64, min(SUMMARY_MAX_TOKENS, int(max_input_tokens * SUMMARY_OUTPUT_SHARE)))


def _render(folded: Sequence[ChatMessage], max_input_tokens: int | None) -> str:
    """The folded turns as text for the summariser, the oldest dropped to fit its context."""
    lines = []
    for message in folded:
        if message.role == "assistant":
            text = message.content or ""
            calls = "; ".join(
                f"{c.name}({json.dumps(c.arguments, ensure_ascii=False, default=str)})"
                for c in message.tool_calls
            )
            lines.append(f"[agent] {text}".rstrip() + (f" [calls] {calls}" if calls else ""))
        elif message.role == "tool":
            lines.append(f"[tool result] {message.content or ''}")
        else:
            lines.append(f"[{message.role}] {message.content or ''}")
    if max_input_tokens is not None:
        reserved = (_output_tokens(max_input_tokens) or 0) + estimate_tokens(SUMMARY_PROMPT) + 64
        budget = max(1, max_input_tokens - reserved)
        kept: list[str] = []
        used = 0
        for line in reversed(lines):
            cost = estimate_tokens(line) + 1
            if used + cost > budget:
                if not kept:  # one message larger than the whole budget: its end
                    kept.append("[…] " + line[-(budget * 4) :])
                left_out = len(lines) - len(kept)
                if left_out:
                    kept.append(f"[{left_out} earlier message(s) left out to fit]")
                break
            kept.append(line)
            used += cost
        lines = list(reversed(kept))
    return "\n".join(lines)
