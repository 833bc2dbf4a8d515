"""How full the model's context is, as far as the loop can tell, and the step that compacts
the conversation when it nears the limit (``planner.compaction`` does the folding).

``ContextWindow.tokens`` is what the next request holds. It is tracked only with a
compactor (without one it stays 0 and nothing compacts): the tool definitions until the
provider reports what it read, then the larger of its count and the estimate, plus the
estimates of the messages appended since (O(1) per round).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from planner.compaction import (
    CompactionError,
    Compactor,
    compact_history,
    estimate_message_tokens,
    should_compact,
)
from planner.events import Compacted, CompactionFailed, RunSink
from planner.llm import CompletionResponse
from planner.messages import ChatMessage
from planner.record import RunLog
from planner.tools import ToolSpec

__all__ = ["ContextWindow"]

logger = logging.getLogger(__name__)


class ContextWindow:
    """The tokens of the next request (``tokens``) and the compaction step of a loop.

    Args:
        compactor: how the loop compacts (``None``: it never does, and nothing is counted).
        specs: the tools offered (their definitions go with every request).
    """

    def __init__(self, compactor: Compactor | None, specs: Sequence[ToolSpec]) -> None:
        self.compactor = compactor
        self.tokens = _tools_tokens(specs) if compactor is not None and specs else 0

    def count(self, messages: Sequence[ChatMessage]) -> None:
        """Add the estimate of ``messages`` (appended to the log)."""
        if self.compactor is not None:
            for message in messages:
                self.tokens += estimate_message_tokens(message)

    def replied(self, reply: ChatMessage, response: CompletionResponse) -> None:
        """Add the stored ``reply``; then take the provider's count when it is larger."""
        if self.compactor is None:
            return
        self.tokens += estimate_message_tokens(reply)
        usage = response.usage
        if usage.prompt_tokens and not usage.estimated:
            # the larger of the provider's count (what it read and wrote: exact where the
            # estimate drifts) and the estimate: endpoints with prompt caching report only the
            # uncached part (ollama/ollama#5370), and trusting them alone never compacts
            self.tokens = max(self.tokens, usage.total_tokens)

    def overflows(self, log: RunLog, extra: Sequence[ChatMessage]) -> str | None:
        """Why a request of the log and ``extra`` (this round's reminders) cannot fit in the
        context (``exhausted``), or ``None`` when it can (always without a compactor)."""
        if self.compactor is None:
            return None
        sent = self.tokens + sum(estimate_message_tokens(message) for message in extra)
        if sent < self.compactor.max_ctx:
            return None
        return self.exhausted(log, "and with this round's reminders the request would not fit")

    async def compact(self, round_no: int, log: RunLog, head: int, emit: RunSink) -> str | None:
        """Compact the log before round ``round_no`` when it nears the context (reported by
        ``emit``: ``Compacted`` or ``CompactionFailed``); ``head``: the messages never folded
        (system prompt, prior messages, objective). Returns why the run cannot go on (the
        error of a ``context_exhausted`` stop, ``exhausted``), else ``None``."""
        compactor = self.compactor
        if compactor is None or not should_compact(
            self.tokens, compactor.max_ctx, compactor.threshold
        ):
            return None
        attempts = log.compaction_attempts
        if attempts >= compactor.max_per_iteration:
            return self.exhausted(
                log,
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
                head=head,
            )
        except CompactionError as exc:
            repeated = str(exc) in log.compaction_errors
            if not (repeated and exc.reason == "nothing_to_fold"):
                logger.warning("compaction before round %d failed: %s", round_no, exc)
                await emit(CompactionFailed(round_no, exc))
        else:
            # what the context held, less what the summary saved: the part no message shows
            # (tool definitions, the provider's framing) stays counted
            saved = compaction.tokens_before - compaction.tokens_after
            after = max(0, self.tokens - saved)
            compaction = dataclasses.replace(
                compaction, tokens_before=self.tokens, tokens_after=after
            )
            self.tokens = after
            await emit(Compacted(round_no, compaction))
        if self.tokens < compactor.max_ctx:
            return None
        if log.compactions_done > compactions_before:
            return self.exhausted(log, "more than the whole context even after compacting")
        return self.exhausted(log, "more than the whole context, and compacting could not help")

    def exhausted(self, log: RunLog, why: str) -> str:
        """The error of a run that stops with ``context_exhausted``: how full the context is,
        ``why``, and the last compaction error."""
        compactor = self.compactor
        assert compactor is not None
        errors = log.compaction_errors
        last = f"; the last compaction attempt: {errors[-1]}" if errors else ""
        threshold = int(compactor.threshold * compactor.max_ctx)
        return (
            f"the conversation holds about {self.tokens} tokens of the "
            f"{compactor.max_ctx}-token context (compaction starts at "
            f"{compactor.threshold:.0%}, {threshold} tokens), {why}{last}"
        )


def _tools_tokens(specs: Sequence[ToolSpec]) -> int:
    """``estimate_tokens(json.dumps(openai_tools))`` of these tools' definitions, from each
    tool's JSON size (``ToolSpec.openai_tool_chars``): the list's text is its items' joined
    by ``", "`` in brackets."""
    chars = 2 + 2 * (len(specs) - 1) + sum(spec.openai_tool_chars for spec in specs)
    return (chars + 3) // 4
