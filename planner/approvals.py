"""Approvals: a person's decision on a destructive call that the policy gate would not run
unasked.

In ``enforce`` with the destructive policy ``ask`` (``planner.policy.DestructivePolicy``), a
destructive call the user has not opted in to is neither run nor refused: the gate's verdict is
``ask``, the loop parks the round at that call (``planner.events.ApprovalRequested``) and the
run stops with ``StopReason.AWAITING_APPROVAL``. Whoever runs the loop stores an *approval
request* (the exact call and ``arguments_hash`` of its arguments) and, once a person decided,
resumes the run from its checkpoint with the decision (``Checkpoint.approvals``):

* ``approved`` — exactly the reviewed call runs, once: the gate sees the ``Approval`` on the
  call's ``ToolContext`` and allows it (reason ``approved``) when its tool and arguments hash
  are the reviewed ones (``Approval.matches``); anything that differs is refused
  (``approval_mismatch``). The other rules (scope, rate limit) still apply.
* ``denied`` or ``expired`` — the call does not run; its tool result says who denied it and
  why (``refusal``), and the decision carries a reminder not to call it again.

The model of this flow is Pydantic AI's deferred tool calls (``ApprovalRequired``, then
``DeferredToolResults`` on the next run) and LangGraph's ``interrupt`` with a checkpointer;
here the pause is durable and tied to the gate's per-user rules and its audit.

Everything here is pure: no clock, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from planner.json_text import storable_json
from planner.messages import ToolCall

__all__ = [
    "Approval",
    "ApprovalStatus",
    "arguments_hash",
]


class ApprovalStatus(StrEnum):
    """Where an approval request stands: ``pending`` (nobody decided yet), ``approved``,
    ``denied``, or ``expired`` (nobody decided within its time to live: it counts as denied).
    A decision is final."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


def arguments_hash(arguments: Mapping[str, Any]) -> str:
    """The SHA-256 (hex, 64 characters) of ``arguments`` as canonical JSON: keys sorted, no
    whitespace, non-ASCII as is (UTF-8), text as it is stored (``storable_json``: NUL and lone
    surrogates as U+FFFD), so that equal argument objects hash alike whatever their key order,
    and the arguments as run, as stored and as checked hash alike. What an approval is bound
    to, besides the tool's name.

    Raises:
        TypeError, ValueError: ``arguments`` is not JSON (a tool call's arguments always are).
    """
    text = json.dumps(
        storable_json(arguments),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval request and where it stands, as the loop and the gate see it.

    Attributes:
        request_id: the stored request's id (what a person approves or denies).
        status: ``ApprovalStatus``.
        tool: the name of the tool the request is for.
        arguments_hash: ``arguments_hash`` of the reviewed arguments.
        decided_by: who decided (``None`` while pending, and for an expiry).
        reason: the decider's words: the note of an approval, the reason of a denial
            (``None``: none given).
        decided_at: when it was decided or expired (UTC-aware; ``None`` while pending).
        target: what the call would act on as its tool read it back for the reviewer when the
            call was parked (``ToolSpec.describe``); ``None``: no read-back was shown. An
            approved call whose read-back differs when it is about to run is not run
            (``planner.call_execution``): the person approved acting on what they saw.
    """

    request_id: int
    status: ApprovalStatus
    tool: str
    arguments_hash: str
    decided_by: str | None = None
    reason: str | None = None
    decided_at: datetime | None = None
    target: str | None = None

    def matches(self, call: ToolCall) -> bool:
        """True when ``call`` is the reviewed call: the same tool and the same arguments (by
        hash). A call whose arguments could not be parsed never matches."""
        if call.parse_error is not None:
            return False
        return self.matches_arguments(call.name, call.arguments)

    def matches_arguments(self, tool: str, arguments: Any) -> bool:
        """True when ``tool`` with ``arguments`` is the reviewed call (``arguments`` that are
        not a JSON object never match)."""
        if tool != self.tool or not isinstance(arguments, Mapping):
            return False
        try:
            return arguments_hash(arguments) == self.arguments_hash
        except (TypeError, ValueError, RecursionError):
            return False

    @property
    def granted(self) -> bool:
        """True when approved."""
        return self.status == ApprovalStatus.APPROVED

    @property
    def decided(self) -> bool:
        """True once approved, denied or expired (a decision is final)."""
        return self.status != ApprovalStatus.PENDING

    def describe(self) -> str:
        """Who decided and why, in words: ``approved by alice (approval 12): note``,
        ``denied by bob (approval 12): too risky``, ``expired unanswered (approval 12)``."""
        where = f"approval {self.request_id}"
        if self.status == ApprovalStatus.EXPIRED:
            return f"expired unanswered ({where})"
        if self.status == ApprovalStatus.PENDING:
            return f"pending ({where})"
        who = self.decided_by or "someone"
        text = f"{self.status.value} by {who} ({where})"
        return f"{text}: {self.reason}" if self.reason else text

    def refusal(self) -> tuple[str, str, str]:
        """For a denied or expired request: ``(reason code, message, reminder)`` of the call's
        decision: the message is its tool result's text (who denied it and why), the reminder
        tells the model not to call it again."""
        name = self.tool
        if self.status == ApprovalStatus.EXPIRED:
            return (
                "approval_expired",
                f"{name} was not run: nobody approved it in time ({self.describe()})",
                f"{name} was not approved in time; do not call it again. Go on without it, or "
                "say in your answer what you would have done.",
            )
        return (
            "approval_denied",
            f"{name} was not run: {self.describe()}",
            f"{name} was denied by a person; do not call it again. Go on without it, or say in "
            "your answer what you would have done.",
        )
