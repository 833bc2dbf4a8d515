"""The reminder channel a mission's loop asks before each request, composed from producers.

``ReminderComposer`` is a ``planner.ReminderChannel``: called with the ``LoopState`` before a
request, it asks every producer, and returns the reminders to send with that request only
(``planner.Reminder``: the text, the producer that wrote it, the role it is sent with):

* ordered by severity (``critical``, then ``warning``, then ``info``; registration order
  within one severity),
* de-duplicated (the same text from two producers is sent once),
* at most ``max_reminders`` (3) texts and ``max_chars`` (1,200) characters per request: what
  does not fit is left out, lowest severity first; a single text longer than the whole budget
  is cut with ``…``,
* isolated: a producer that raises is logged, reported to ``on_error`` and skipped; the round
  goes on.

What was sent is part of the run's record (``planner.RequestSent`` carries it, round by round):
the audit the worker stores with the iteration, apart from the message log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from planner import LoopState, Reminder, ReminderRole, SentReminder

__all__ = [
    "MAX_REMINDERS",
    "MAX_REMINDER_CHARS",
    "Producer",
    "ReminderComposer",
    "SentReminder",
    "Severity",
]

logger = logging.getLogger(__name__)

Severity = Literal["critical", "warning", "info"]
_RANK: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}

MAX_REMINDERS = 3
"""Reminders per request at most: more would drown the one that matters."""

MAX_REMINDER_CHARS = 1200
"""Characters of reminders per request at most (about 300 tokens)."""


@dataclass(frozen=True)
class Producer:
    """One producer in a channel.

    Attributes:
        name: a short identifier (metric label, audit), e.g. ``token_budget``.
        severity: ``critical`` | ``warning`` | ``info``; decides the order and what is left out.
        produce: ``state -> text or None``.
    """

    name: str
    severity: Severity
    produce: Callable[[LoopState], str | None]


@dataclass
class ReminderComposer:
    """A reminder channel composed of ``producers`` (see the module docstring).

    Attributes:
        producers: asked in order at every round.
        max_reminders, max_chars: the per-request limits (3 and 1,200 by default).
        role: the role the reminders are sent with (``system``; ``user`` for chat templates
            that refuse a system message after the first, e.g. Mistral's and Gemma's).
        on_error: called with the producer's name and the exception when a producer raises.
    """

    producers: Sequence[Producer]
    max_reminders: int = MAX_REMINDERS
    max_chars: int = MAX_REMINDER_CHARS
    role: ReminderRole = "system"
    on_error: Callable[[str, Exception], None] | None = None

    def __post_init__(self) -> None:
        self._ordered = sorted(self.producers, key=lambda p: _RANK[p.severity])
        self._steps = tuple((p.name, p.produce) for p in self._ordered)

    def __call__(self, state: LoopState) -> list[Reminder]:
        """The reminders for the request of ``state.round``, as described in the module doc."""
        chosen: list[Reminder] = []
        seen: set[str] = set()
        chars = 0
        for name, produce in self._steps:
            try:
                text = produce(state)
            except Exception as exc:  # a broken producer must not fail the round
                logger.exception("reminder producer %s failed; skipped", name)
                if self.on_error is not None:
                    self.on_error(name, exc)
                continue
            if not text:  # most rounds, most producers
                continue
            text = text.strip()
            if not text or text in seen or len(chosen) >= self.max_reminders:
                continue
            if chars + len(text) > self.max_chars:
                if chosen:
                    continue  # a more important reminder already took the space
                text = text[: self.max_chars - 1] + "…"
            seen.add(text)
            chars += len(text)
            chosen.append(Reminder(text, name, self.role))
        return chosen
