"""Reminder producers and the channel that composes them.

Producers (``reminders.producers``) are small pure functions of the loop state plus their own
inputs that return a hint or ``None``; ``ReminderComposer`` (``reminders.channel``) turns a
list of them into the ``reminder_channel`` of a loop: ordered by severity, de-duplicated,
capped, isolated from failures, and audited. The loop sends the texts with one request only,
as ``<reminder>…</reminder>`` system messages, and never stores them (see ``planner.loop``).
"""

import lazy_loader

# Each name is imported from its module on first use (named in __init__.pyi): the settings
# check reminder names (``PRODUCER_NAMES``) without loading the channel and the planner.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
