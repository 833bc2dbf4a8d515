"""``policy_feedback_reminder``: tell the model, in the next request, why the policy gate
refused its calls in the last round."""

from __future__ import annotations

from planner import LoopState

__all__ = ["policy_feedback_reminder"]


def policy_feedback_reminder(state: LoopState) -> str | None:
    """The ``reminder`` texts of the decisions that refused calls in the last round, one per
    line and each once (several refused calls of one tool give one line), or ``None`` when no
    call was refused or no decision carries a reminder.

    Works with any ``PolicyDecision`` that has ``allow=False`` and a ``reminder`` (the
    policy gate sets one on every denial in ``enforce``; ``log-only`` decisions never refuse).
    """
    texts = [
        call.decision.reminder
        for call in state.last_round_calls
        if call.decision is not None and not call.decision.allow and call.decision.reminder
    ]
    if not texts:
        return None
    return "\n".join(dict.fromkeys(texts))
