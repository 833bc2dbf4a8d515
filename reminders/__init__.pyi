"""The reminders' public names, for type checkers and for ``lazy_loader.attach_stub``
(``reminders/__init__.py``)."""

from .channel import (
    MAX_REMINDER_CHARS,
    MAX_REMINDERS,
    Producer,
    ReminderComposer,
    SentReminder,
    Severity,
)
from .producers import (
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
