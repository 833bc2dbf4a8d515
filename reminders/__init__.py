"""Reminder producers: small pure functions of the loop state that return a hint or ``None``.

The producers named in shared/DESIGN.md (token budget, rounds left, retry loop, compacted)
arrive with the reminder-channel issue; the loop already takes a ``reminder_channel`` and
sends its texts with one request only (see ``planner.loop``).
"""
