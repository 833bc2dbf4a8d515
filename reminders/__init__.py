"""Reminder producers and the channel that composes them.

Producers (``reminders.producers``) are small pure functions of the loop state plus their own
inputs that return a hint or ``None``; ``ReminderComposer`` (``reminders.channel``) turns a
list of them into the ``reminder_channel`` of a loop: ordered by severity, de-duplicated,
capped, isolated from failures, and audited. The loop sends the texts with one request only,
as ``<reminder>…</reminder>`` system messages, and never stores them (see ``planner.loop``).
"""

from reminders.channel import (
    MAX_REMINDER_CHARS,
    MAX_REMINDERS,
    Producer,
    ReminderComposer,
    SentReminder,
    Severity,
)
from reminders.producers import (
    BUDGET_THRESHOLD,
    DEADLINE_WITHIN,
    PRODUCER_NAMES,
    RETRY_REPEATS,
    ROUNDS_LEFT,
    RetryLoopWatch,
    compacted_reminder,
    deadline_reminder,
    policy_feedback_reminder,
    retry_loop_reminder,
    rounds_left_reminder,
    token_budget_reminder,
)

__all__ = [
    "BUDGET_THRESHOLD",
    "DEADLINE_WITHIN",
    "MAX_REMINDERS",
    "MAX_REMINDER_CHARS",
    "PRODUCER_NAMES",
    "RETRY_REPEATS",
    "ROUNDS_LEFT",
    "Producer",
    "ReminderComposer",
    "RetryLoopWatch",
    "SentReminder",
    "Severity",
    "compacted_reminder",
    "deadline_reminder",
    "policy_feedback_reminder",
    "retry_loop_reminder",
    "rounds_left_reminder",
    "token_budget_reminder",
]
