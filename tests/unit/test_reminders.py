"""Reminder producers, table-driven."""

from __future__ import annotations

import pytest

from planner import ExecutedCall, LoopState, PolicyDecision, TokenUsage, ToolCall
from reminders import policy_feedback_reminder


def executed(decision: PolicyDecision | None, name: str = "notes_delete") -> ExecutedCall:
    error = None if decision is None or decision.allow else "denied"
    return ExecutedCall(2, ToolCall(id="c", name=name), None, error, decision)


def state(*calls: ExecutedCall) -> LoopState:
    return LoopState(
        round=3,
        tool_call_count=len(calls),
        tokens_used=TokenUsage(),
        last_call=calls[-1] if calls else None,
        last_round_calls=calls,
    )


REFUSED = PolicyDecision(allow=False, reason="destructive_not_opted_in", reminder="needs opt-in")
RATE = PolicyDecision(allow=False, reason="rate_limited", reminder="rate-limited")
WOULD_DENY = PolicyDecision(allow=True, reason="rate_limited", verdict="deny", reminder=None)
NO_TEXT = PolicyDecision(allow=False, reason="x")


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ((), None),
        ((executed(None),), None),
        ((executed(PolicyDecision(allow=True)),), None),
        ((executed(WOULD_DENY),), None),
        ((executed(NO_TEXT),), None),
        ((executed(REFUSED),), "needs opt-in"),
        ((executed(REFUSED), executed(REFUSED)), "needs opt-in"),
        ((executed(REFUSED), executed(None), executed(RATE)), "needs opt-in\nrate-limited"),
    ],
)
def test_policy_feedback_reminder(calls: tuple[ExecutedCall, ...], expected: str | None) -> None:
    assert policy_feedback_reminder(state(*calls)) == expected
