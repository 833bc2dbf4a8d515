"""A tool call with its outcome, and the tool result message the model reads for it.

``ExecutedCall`` is what every call of a round ends as, whatever happened to it (it ran, the
gate refused it, its tool was unknown, its arguments were invalid, it timed out);
``tool_result_message`` is its answer in the conversation, ``denial_text`` the error of a call
the policy gate refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from planner.json_text import json_text
from planner.messages import ChatMessage, ToolCall
from planner.policy import PolicyDecision

__all__ = ["ExecutedCall", "denial_text", "tool_result_message"]


@dataclass(frozen=True)
class ExecutedCall:
    """One tool call and its outcome.

    Attributes:
        round: the 1-based round the call was issued in.
        call: the call as the model issued it.
        result: the handler's return value (``None`` on error).
        error: the error text the model read, or ``None`` on success.
        decision: the policy decision, or ``None`` when no gate ran (no gate, or unknown tool).
        duration_ms: the call's own wall time in milliseconds: checks, gate and handler; time
            spent waiting for a free slot or for a barrier is not included.
        index: the 0-based position of the call in its assistant message (source order).
        ran: ``True`` when the handler (or executor) was started: the tool is known, its
            arguments were valid and the gate allowed it.
        outcome_unknown: the call was running when its worker stopped, and what it did is
            not known (a resumed run answers it with an error result saying so).
    """

    round: int
    call: ToolCall
    result: Any
    error: str | None
    decision: PolicyDecision | None = None
    duration_ms: float = 0.0
    index: int = 0
    ran: bool = False
    outcome_unknown: bool = False

    @property
    def ok(self) -> bool:
        """True when the call ran and returned without error."""
        return self.error is None


def tool_result_message(executed: ExecutedCall) -> ChatMessage:
    """The tool message answering ``executed.call``.

    Content is the result as JSON (a ``str`` result is sent as is), or ``{"error": "..."}``.
    """
    if executed.error is not None:
        content = json_text({"error": executed.error})
    elif isinstance(executed.result, str):
        content = executed.result
    else:
        try:
            content = json_text(executed.result)
        except (ValueError, RecursionError) as exc:  # circular or absurdly deep results
            content = json.dumps(
                {"error": f"{executed.call.name} returned a result that is not JSON ({exc})"}
            )
    # the validator itself, not ChatMessage(...): the same message, without the Python frame
    # of BaseModel.__init__ (a tool message is made for every call)
    return _MESSAGE({"role": "tool", "content": content, "tool_call_id": executed.call.id})  # type: ignore[no-any-return]


_MESSAGE = ChatMessage.__pydantic_validator__.validate_python


_PEOPLES_DECISIONS = frozenset({"approval_denied", "approval_expired"})
"""Reasons of a refusal that a person decided (or nobody did in time), not the rules."""


def denial_text(decision: PolicyDecision) -> str:
    """The error a refused call's tool result carries, e.g. ``denied by policy
    (destructive_not_opted_in): notes_delete is destructive and …``; for a call a person
    denied (or nobody approved in time), the decision's message as it is (``notes_delete was
    not run: denied by bob (approval 12): …``); for a call that waits for approval where
    waiting is impossible, ``not run: it needs a person's approval (…)``."""
    reason = decision.reason or "no reason given"
    if decision.reason in _PEOPLES_DECISIONS and decision.message:
        return decision.message
    if decision.verdict == "ask":
        return f"not run: it needs a person's approval ({reason}): {decision.message or reason}"
    if decision.message:
        return f"denied by policy ({reason}): {decision.message}"
    return f"denied by policy: {reason}"
