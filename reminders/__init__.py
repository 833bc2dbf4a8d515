"""Reminder producers: small pure functions of the loop state that return a hint or ``None``.

The loop sends their texts with one request only, as ``<reminder>…</reminder>`` system
messages, and never stores them (see ``planner.loop``). The other producers named in
shared/DESIGN.md (token budget, rounds left, retry loop, compacted) arrive with the
reminder-channel issue.
"""

from reminders.policy_feedback import policy_feedback_reminder

__all__ = ["policy_feedback_reminder"]
