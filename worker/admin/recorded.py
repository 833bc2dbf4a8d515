"""What a rerun replays instead of the live parts: the recorded model replies, the recorded
summaries and the rate-limit slots of the iteration's own calls at their recorded times
(``worker.admin.rerun``)."""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from planner import (
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    LLMError,
    TokenUsage,
    ToolCall,
)
from planner.gate import Reservation
from planner.policy import RateLimit
from planner.testing import InMemoryCallLedger
from worker.admin.replay import ReplayError
from worker.queries.stored import StoredCompaction, StoredInvocation

__all__ = ["RecordedModel", "RecordedSummariser", "RerunLedger", "current_call"]

Row = dict[str, Any]


class RecordedModel:
    """Answers request N with the N-th recorded assistant reply; knows the round and the
    position of every call it handed out (by identity: call ids may repeat)."""

    def __init__(self, replies: Sequence[Row], final_error: str | None) -> None:
        self.responses = [_response(n, stored) for n, stored in enumerate(replies, start=1)]
        self.final_error = final_error
        self.round = 0
        self._positions: dict[int, tuple[int, int]] = {}

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        self.round += 1
        if self.round > len(self.responses):
            if self.round == len(self.responses) + 1 and self.final_error:
                raise LLMError(self.final_error)
            raise LLMError(
                f"the recording ends after round {len(self.responses)} (a rerun cannot ask "
                "the model)"
            )
        response = self.responses[self.round - 1]
        for position, call in enumerate(response.message.tool_calls):
            self._positions[id(call)] = (self.round, position)
        return response

    def position_of(self, call: ToolCall) -> tuple[int, int] | None:
        """``(round, position)`` of a call this model handed out."""
        return self._positions.get(id(call))


def _response(round_no: int, stored: Row) -> CompletionResponse:
    """The recorded reply of ``round_no`` as the model's response."""
    stored = dict(stored)
    info = stored.pop("reply_info", None) or {}
    try:
        return CompletionResponse(
            message=ChatMessage.from_json(stored),
            usage=TokenUsage.model_validate(
                (info.get("usage") if isinstance(info, dict) else None) or {}
            ),
            finish_reason=info.get("finish_reason") if isinstance(info, dict) else None,
            endpoint=info.get("endpoint") if isinstance(info, dict) else None,
        )
    except ValidationError as exc:
        raise ReplayError(
            f"the recorded reply of round {round_no} cannot be read back: "
            f"{exc.errors()[0].get('loc')} {exc.errors()[0].get('msg')}"
        ) from exc


class RecordedSummariser:
    """Answers the k-th summarisation with the k-th recorded attempt."""

    def __init__(self, attempts: Sequence[StoredCompaction]) -> None:
        self.attempts = deque(attempts)

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        if not self.attempts:
            text = "(rerun: no summary was recorded for this compaction)"
            return CompletionResponse(message=ChatMessage(role="assistant", content=text))
        row = self.attempts.popleft()
        error = row.get("error")
        if error:
            reason, _, message = str(error).partition(": ")
            if reason == "unusable_summary":
                return CompletionResponse(message=ChatMessage(role="assistant", content=""))
            # the recorded error already says "the summariser failed: …"; raise its cause
            raise LLMError((message or str(error)).removeprefix("the summariser failed: "))
        return CompletionResponse(
            message=ChatMessage(role="assistant", content=str(row.get("summary") or ""))
        )


current_call: contextvars.ContextVar[StoredInvocation | None] = contextvars.ContextVar(
    "reruncurrent_call", default=None
)


class RerunLedger:
    """Rate-limit slots of this iteration's calls at their recorded times; a call the limit
    refused when recorded is refused again."""

    def __init__(self, start: datetime) -> None:
        self.now = start
        self.counted = InMemoryCallLedger(clock=lambda: self.now)

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        recorded = current_call.get()
        if recorded is not None and isinstance(recorded.get("created_at"), datetime):
            self.now = max(self.now, recorded["created_at"])
        decision = (recorded or {}).get("policy_decision") or {}
        if decision.get("reason") == "rate_limited":
            return Reservation(False, self.now, (self.now,) * limit.calls)
        return await self.counted.reserve(
            user_id=user_id, tool=tool, limit=limit, consumer=consumer
        )
