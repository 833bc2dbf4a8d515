"""A mission's reminder channel: the producers of ``reminders`` wired to the mission's
budget, deadline and clock, with metrics for what is sent and what fails.

Producers (name, severity): ``policy_feedback`` (critical), ``retry_loop``, ``rounds_left``,
``deadline``, ``token_budget`` (warning), ``compacted`` (info). ``MANA_AI_REMINDERS=off``
turns the channel off; ``MANA_AI_REMINDERS_DISABLED`` turns single producers off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime

from planner import LoopState, ReminderRole
from reminders import (
    Producer,
    ReminderComposer,
    RetryLoopWatch,
    compacted_reminder,
    deadline_reminder,
    policy_feedback_reminder,
    rounds_left_reminder,
    token_budget_reminder,
)
from worker import metrics

__all__ = ["mission_reminder_channel"]

logger = logging.getLogger(__name__)


def mission_reminder_channel(
    *,
    max_tokens_per_day: int | None,
    tokens_used_24h: int,
    deadline: datetime | None,
    clock: Callable[[], datetime],
    disabled: Collection[str] = (),
    replace: Mapping[str, Callable[[LoopState], str | None]] | None = None,
    role: ReminderRole = "system",
) -> ReminderComposer:
    """The channel of one iteration (its producers keep per-loop state: build one per run).

    Args:
        max_tokens_per_day: the agent's daily budget (``None``: none).
        tokens_used_24h: the agent's tokens of the last 24 h before this run (loaded once);
            the loop's own usage is added at every round.
        deadline: the mission's deadline (UTC-aware) or ``None``.
        clock: UTC-aware now, read at every round for the deadline.
        disabled: producer names to leave out (see ``reminders.PRODUCER_NAMES``).
        replace: producer name -> function to produce its texts instead (``replay --rerun``
            replays the reminders that depend on the time and on other runs).
        role: the role the reminders are sent with (``MANA_AI_REMINDER_ROLE``).

    What is sent is counted from the run's events (``worker.run.run_metrics``).
    """

    def budget(state: LoopState) -> str | None:
        used = tokens_used_24h + state.tokens_used.total_tokens
        return token_budget_reminder(max_tokens_per_day, used)

    def rounds(state: LoopState) -> str | None:
        return rounds_left_reminder(state, state.max_rounds)

    def near_deadline(state: LoopState) -> str | None:
        return deadline_reminder(deadline, clock())

    producers = [
        Producer("policy_feedback", "critical", policy_feedback_reminder),
        Producer("retry_loop", "warning", RetryLoopWatch()),
        Producer("rounds_left", "warning", rounds),
        Producer("deadline", "warning", near_deadline),
        Producer("token_budget", "warning", budget),
        Producer("compacted", "info", compacted_reminder),
    ]
    if replace:
        producers = [
            Producer(p.name, p.severity, replace.get(p.name, p.produce)) for p in producers
        ]
    return ReminderComposer(
        [p for p in producers if p.name not in disabled], role=role, on_error=_count_error
    )


def _count_error(producer: str, exc: Exception) -> None:
    metrics.REMINDER_PRODUCER_ERRORS.labels(producer=producer).inc()
