"""Reminder producers: small pure functions of the loop state (plus their own inputs) that
return a short hint for the model's next request, or ``None``.

Each threshold is a parameter with a documented default. Texts are written for the model: they
say what is the case and what to do about it, in one or two sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the settings read PRODUCER_NAMES without the planner
    from planner import ExecutedCall, LoopState

__all__ = [
    "BUDGET_THRESHOLD",
    "DEADLINE_WITHIN",
    "PRODUCER_NAMES",
    "RETRY_REPEATS",
    "ROUNDS_LEFT",
    "RetryLoopWatch",
    "compacted_reminder",
    "deadline_reminder",
    "policy_feedback_reminder",
    "retry_loop_reminder",
    "rounds_left_reminder",
    "token_budget_reminder",
]

PRODUCER_NAMES = (
    "policy_feedback",
    "retry_loop",
    "rounds_left",
    "deadline",
    "token_budget",
    "compacted",
)
"""The names of this package's producers, as a channel's audit records them and a worker's
``MANA_AI_REMINDERS_DISABLED`` names them."""

BUDGET_THRESHOLD = 0.75
"""Share of the daily token budget from which the model is told to plan frugally (seed: 75 %)."""

ROUNDS_LEFT = 2
"""Rounds left (the current one included) from which the model is told to finish."""

RETRY_REPEATS = 3
"""Identical calls, or failures of one tool, in a row that make a retry loop."""

DEADLINE_WITHIN = timedelta(minutes=30)
"""How close the mission's deadline must be for the model to be told."""


def token_budget_reminder(
    max_tokens_per_day: int | None, usage_24h: int, threshold: float = BUDGET_THRESHOLD
) -> str | None:
    """The agent's token use against its daily budget, from ``threshold`` (0.75) of it on.

    Args:
        max_tokens_per_day: the agent's budget (``None``: no budget, no reminder).
        usage_24h: tokens used in the last 24 hours, this loop's included.
        threshold: share of the budget (0..1] from which to remind.
    """
    if not max_tokens_per_day or max_tokens_per_day <= 0 or usage_24h < 0:
        return None
    share = usage_24h / max_tokens_per_day
    if share < threshold:
        return None
    used = f"{usage_24h:,} of {max_tokens_per_day:,} tokens in the last 24 h"
    if share >= 1:
        return (
            f"The agent's daily token budget is used up ({used}). Finish now with what you "
            "have: no more tool calls unless they are essential."
        )
    return (
        f"{int(share * 100)} % of the agent's daily token budget is used ({used}). Plan "
        "frugally: fewer rounds, short answers, only the tool calls you need."
    )


def rounds_left_reminder(
    state: LoopState, max_rounds: int, when_left: int = ROUNDS_LEFT
) -> str | None:
    """From ``when_left`` (2) rounds left on, counting the one about to run: e.g. "Round 4 of
    5: finish or save progress"; in the last round, that it is the last. An agent that only
    ever has ``when_left`` rounds or fewer is told about its last round only, and a one-round
    agent nothing (it would be told so on every request)."""
    left = max_rounds - state.round + 1
    if left < 1 or max_rounds <= 1:
        return None
    if left > 1 and (left > when_left or max_rounds <= when_left):
        return None
    if left == 1:
        return (
            f"Round {state.round} of {max_rounds}, the last one: give your final answer now, "
            "or save your progress with this round's tool calls (you will not see their results)."
        )
    return (
        f"Round {state.round} of {max_rounds}: {left} rounds left, this one included. Finish "
        "or save progress."
    )


def same_call(a: ExecutedCall, b: ExecutedCall) -> bool:
    """Same tool and the same arguments, compared as JSON values (key order does not matter;
    arguments that cannot be compared count as different)."""
    if a.call.name != b.call.name:
        return False
    try:
        return bool(a.call.arguments == b.call.arguments)
    except Exception:  # e.g. a RecursionError on absurdly nested arguments
        return False


def retry_loop_reminder(
    state: LoopState, history: Sequence[ExecutedCall], repeats: int = RETRY_REPEATS
) -> str | None:
    """The model is going round in circles: the last ``repeats`` (3) calls of ``history`` are
    the same call (tool and arguments compared canonically), or calls of one tool that all
    failed. Only the last ``repeats`` calls are read.

    Args:
        state: the loop state (unused beyond the contract; producers share one signature).
        history: executed calls so far, oldest first (only the tail is read).
        repeats: how many in a row make a loop (at least 2).
    """
    if repeats < 2 or len(history) < repeats:
        return None
    tail = list(history[-repeats:])
    if any(c.call.name != tail[-1].call.name for c in tail):
        return None
    same = all(same_call(c, tail[-1]) for c in tail[:-1])
    return _retry_text(tail[-1], repeats, same, all(c.error is not None for c in tail))


def _retry_text(last: ExecutedCall, repeats: int, same: bool, all_failed: bool) -> str | None:
    if not (same or all_failed):
        return None  # one tool called again and again, with other arguments, and working
    tool = last.call.name
    last_error = _short(last.error or "")
    if same:
        if all_failed:
            return (
                f"You called {tool} with the same arguments {repeats} times in a row and it "
                f"failed each time (last error: {last_error}). Repeating it will not change the "
                "result: change your approach (other arguments, another tool) or answer with "
                "what you have."
            )
        return (
            f"You called {tool} with the same arguments {repeats} times in a row. Unless you "
            "are waiting for something to change, do not call it again: use what it returned, "
            "change your approach, or answer."
        )
    if all_failed:
        return (
            f"{tool} failed {repeats} times in a row (last error: {last_error}). Change your "
            f"approach instead of calling {tool} again."
        )
    return None


class RetryLoopWatch:
    """``retry_loop_reminder`` as a producer of the state alone, O(1) per call: it follows
    each round's ``LoopState.last_round_calls`` with two running counts (identical calls in a
    row, failures of one tool in a row), reading every call once, never the history.

    Create one per loop; call it once per round, as a reminder channel does.
    """

    def __init__(self, repeats: int = RETRY_REPEATS) -> None:
        self.repeats = repeats
        self._seen_round = 0
        self._last: ExecutedCall | None = None
        self._same_run = 0  # identical calls in a row, ending with the last call
        self._tool_run = 0  # calls of the last call's tool in a row
        self._fail_run = 0  # failures in a row, ending with the last call (same tool)

    def __call__(self, state: LoopState) -> str | None:
        """Take in the previous round's calls (once per round), then judge the runs."""
        if state.round != self._seen_round:
            self._seen_round = state.round
            for call in state.last_round_calls:
                self._take(call)
        last = self._last
        if self.repeats < 2 or last is None or self._tool_run < self.repeats:
            return None
        same = self._same_run >= self.repeats
        return _retry_text(last, self.repeats, same, self._fail_run >= self.repeats)

    def _take(self, call: ExecutedCall) -> None:
        previous = self._last
        same_tool = previous is not None and previous.call.name == call.call.name
        same = same_tool and previous is not None and same_call(previous, call)
        self._tool_run = self._tool_run + 1 if same_tool else 1
        self._same_run = self._same_run + 1 if same else 1
        self._fail_run = (self._fail_run + 1 if same_tool else 1) if call.error is not None else 0
        self._last = call


def deadline_reminder(
    deadline: datetime | None, now: datetime, within: timedelta = DEADLINE_WITHIN
) -> str | None:
    """The mission's deadline is within ``within`` (30 min) of ``now``, or past.

    Args:
        deadline: the mission's deadline (UTC-aware), ``None`` for none.
        now: the current time (UTC-aware).
        within: how close counts as close.
    """
    if deadline is None:
        return None
    remaining = deadline - now
    if remaining > within:
        return None
    at = deadline.isoformat(timespec="minutes")
    if remaining <= timedelta(0):
        return (
            f"The mission's deadline ({at}) passed {_minutes(-remaining)} ago: wrap up now and "
            "answer with what you have."
        )
    return f"The mission's deadline is in {_minutes(remaining)} (at {at}): finish soon."


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


def compacted_reminder(state: LoopState) -> str | None:
    """Earlier turns were summarised (``state.compactions_done`` > 0): say so, and that the
    summary stands in for them."""
    if state.compactions_done <= 0:
        return None
    times = "once" if state.compactions_done == 1 else f"{state.compactions_done} times"
    return (
        f"Earlier turns of this conversation were summarised to fit the context ({times}). "
        "Rely on the summary; call the tools again for details you need verbatim."
    )


def _minutes(delta: timedelta) -> str:
    minutes = max(1, round(delta.total_seconds() / 60))
    if minutes < 120:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{minutes // 60} hours"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
