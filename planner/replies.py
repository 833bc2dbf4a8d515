"""What one reply means for the loop: tool calls to run, an answer, or a stop that is no answer.

A reply is judged by its tool calls, its ``finish_reason`` (OpenAI vocabulary, see
``CompletionResponse``) and whether it has any text. The loop acts on the ``Verdict``:

=====================================  =====================================  ===============
reply                                  the loop                               stop reason
=====================================  =====================================  ===============
tool calls (finish ``stop``,           runs them (a call whose JSON was cut   (goes on)
``tool_calls``, ``length``, …)         gets an error result saying so)
text, finish ``stop`` / unknown / none stops                                  ``final_answer``
finish ``length``, no tool calls,      stores the cut reply, then tells the   (goes on)
a round left                           model it was cut and asks again
finish ``length``, no tool calls,      stops                                  ``truncated``
last round
finish ``content_filter`` (with or     stops; tool calls are not run, each    ``content_filtered``
without tool calls)                    answered "not run"
no text (null, empty, blank, or only  stops                                  ``empty_answer``
``<think>…</think>``), no tool calls,
finish ``stop`` or none
finish ``tool_calls`` but no tool      stops: the calls were lost on the way  ``llm_error``
calls
finish ``error``                       stops (providers raise instead)        ``llm_error``
=====================================  =====================================  ===============

``truncated``, ``content_filtered``, ``empty_answer`` and ``llm_error`` are failures
(``FAILED_STOP_REASONS``): a mission never stores a cut, withheld, empty or errored reply as
its answer. The error text says which and quotes the finish reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from planner.calls import ExecutedCall, tool_result_message
from planner.llm import CompletionResponse
from planner.messages import ChatMessage, ReplyInfo

__all__ = [
    "FAILED_STOP_REASONS",
    "TRUNCATED_NOTE",
    "StopReason",
    "Verdict",
    "judge_reply",
    "stored_reply",
]


class StopReason(StrEnum):
    """Why a run of the planner loop ended (stored as ``mission_iterations.stop_reason``)."""

    FINAL_ANSWER = "final_answer"
    MAX_ROUNDS = "max_rounds"
    LLM_ERROR = "llm_error"
    TRUNCATED = "truncated"
    CONTENT_FILTERED = "content_filtered"
    EMPTY_ANSWER = "empty_answer"
    CONTEXT_EXHAUSTED = "context_exhausted"
    AWAITING_APPROVAL = "awaiting_approval"
    """Not an end: the run stopped at a call that waits for a person's approval
    (``planner.approvals``) and goes on from its checkpoint once a person decided."""


FAILED_STOP_REASONS: frozenset[StopReason] = frozenset(
    {
        StopReason.LLM_ERROR,
        StopReason.TRUNCATED,
        StopReason.CONTENT_FILTERED,
        StopReason.EMPTY_ANSWER,
        StopReason.CONTEXT_EXHAUSTED,
    }
)
"""Stop reasons that make an iteration ``failed``."""

TRUNCATED_NOTE = (
    "Your previous reply was cut off: it reached the output-token limit "
    '(finish_reason "length") before it was complete. Give your complete answer again, shorter.'
)
"""The user message that follows a reply cut at the output-token limit."""


@dataclass(frozen=True)
class Verdict:
    """What the loop does with one reply.

    Attributes:
        stop_reason: ``None`` to go on (run the tool calls, or ask again after ``follow_up``);
            else the loop's stop reason.
        error: why a failing stop happened, for the operator; ``None`` otherwise.
        follow_up: messages for the stored log right after the reply (a note to the model,
            or the results of calls that were not run).
    """

    stop_reason: StopReason | None
    error: str | None = None
    follow_up: tuple[ChatMessage, ...] = ()


def stored_reply(response: CompletionResponse) -> ChatMessage:
    """The reply as the stored log keeps it: an assistant message with its ``reply_info``."""
    info = _REPLY_INFO(
        {
            "endpoint": response.endpoint,
            "finish_reason": response.finish_reason,
            "usage": response.usage,
        }
    )
    message = response.message
    # a new message rather than model_copy(update=...): the loop does this every round, and
    # pydantic's validation of instances is several times cheaper than its copy; the
    # validators themselves, without the Python frame of BaseModel.__init__
    return _MESSAGE(  # type: ignore[no-any-return]
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": message.tool_calls,
            "tool_call_id": message.tool_call_id,
            "provider_fields": message.provider_fields,
            "reply_info": info,
        }
    )


_REPLY_INFO = ReplyInfo.__pydantic_validator__.validate_python
_MESSAGE = ChatMessage.__pydantic_validator__.validate_python


def judge_reply(response: CompletionResponse, *, round: int, max_rounds: int) -> Verdict:
    """The Verdict for ``response``, received in 1-based ``round`` of ``max_rounds``.

    See the module docstring for the table it implements.
    """
    reply = response.message
    reason = response.finish_reason
    if reply.tool_calls and reason not in _JUDGED_WITH_CALLS:
        return _GOES_ON  # the common case: calls to run
    said = f"(finish_reason {reason!r})"
    if reason == "error":
        return Verdict(
            StopReason.LLM_ERROR, f"the model reported an error instead of an answer {said}"
        )
    if reason == "content_filter":
        not_run = tuple(
            tool_result_message(
                ExecutedCall(round, call, None, "not run: the endpoint filtered this reply")
            )
            for call in reply.tool_calls
        )
        error = f"the endpoint withheld or filtered the answer {said}"
        return Verdict(StopReason.CONTENT_FILTERED, error, not_run)
    if reply.tool_calls:
        return Verdict(None)
    if reason == "tool_calls":
        return Verdict(
            StopReason.LLM_ERROR, f"the endpoint reported tool calls but sent none {said}"
        )
    if reason == "length":
        if round < max_rounds:
            return Verdict(None, follow_up=(ChatMessage(role="user", content=TRUNCATED_NOTE),))
        return Verdict(
            StopReason.TRUNCATED,
            f"the answer was cut off at the output-token limit in the last round {said}",
        )
    if not answer_text(reply.content):
        return Verdict(
            StopReason.EMPTY_ANSWER, f"the model answered with no text and no tool calls {said}"
        )
    return Verdict(StopReason.FINAL_ANSWER)


_JUDGED_WITH_CALLS = frozenset({"error", "content_filter"})
"""Finish reasons that decide a reply even when it calls tools."""

_GOES_ON = Verdict(None)
"""The verdict on a reply whose calls run (frozen: one for all)."""

_THINKING = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)


def answer_text(content: str | None) -> str:
    """``content`` without reasoning blocks (``<think>…</think>``, as DeepSeek-R1, Qwen3 and
    others send in the text when the endpoint does not split them out), stripped: what the
    answer says."""
    return _THINKING.sub("", content or "").strip()
