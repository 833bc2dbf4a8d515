"""The reminder channel a mission's loop asks before each request, composed from producers.

``ReminderComposer`` is a ``planner.ReminderChannel``: called with the ``LoopState`` before a
request, it asks every producer, and returns the texts to send with that request only:

* ordered by severity (``critical``, then ``warning``, then ``info``; registration order
  within one severity),
* de-duplicated (the same text from two producers is sent once),
* at most ``max_reminders`` (3) texts and ``max_chars`` (1,200) characters per request: what
  does not fit is left out, lowest severity first; a single text longer than the whole budget
  is cut with ``…``,
* isolated: a producer that raises is logged, reported to ``on_error`` and skipped; the round
  goes on.

Everything sent is kept in ``sent`` (round, producer, text): the audit the worker stores with
the iteration, apart from the message log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from planner import LoopState

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


@dataclass(frozen=True)
class SentReminder:
    """One reminder sent with one request: the audit record."""

    round: int
    producer: str
    text: str

    def to_json(self) -> dict[str, object]:
        """``{"round", "producer", "text"}``, the stored form."""
        return {"round": self.round, "producer": self.producer, "text": self.text}


@dataclass
class ReminderComposer:
    """A reminder channel composed of ``producers`` (see the module docstring).

    Attributes:
        producers: asked in order at every round.
        max_reminders, max_chars: the per-request limits (3 and 1,200 by default).
        on_sent: called with each reminder sent (metrics).
        on_error: called with the producer's name and the exception when a producer raises.
        sent: every reminder sent so far, in order.
    """

    producers: Sequence[Producer]
    max_reminders: int = MAX_REMINDERS
    max_chars: int = MAX_REMINDER_CHARS
    on_sent: Callable[[SentReminder], None] | None = None
    on_error: Callable[[str, Exception], None] | None = None
    sent: list[SentReminder] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ordered = sorted(self.producers, key=lambda p: _RANK[p.severity])

    def __call__(self, state: LoopState) -> list[str]:
        """The texts for the request of ``state.round``, as described in the module doc."""
        chosen: list[SentReminder] = []
        seen: set[str] = set()
        chars = 0
        for producer in self._ordered:
            try:
                text = producer.produce(state)
            except Exception as exc:  # a broken producer must not fail the round
                logger.exception("reminder producer %s failed; skipped", producer.name)
                if self.on_error is not None:
                    self.on_error(producer.name, exc)
                continue
            if not text or not text.strip():
                continue
            text = text.strip()
            if text in seen or len(chosen) >= self.max_reminders:
                continue
            if chars + len(text) > self.max_chars:
                if chosen:
                    continue  # a more important reminder already took the space
                text = text[: self.max_chars - 1] + "…"
            seen.add(text)
            chars += len(text)
            chosen.append(SentReminder(state.round, producer.name, text))
        for reminder in chosen:
            self.sent.append(reminder)
            if self.on_sent is not None:
                self.on_sent(reminder)
        return [r.text for r in chosen]

    def audit(self) -> list[dict[str, object]]:
        """Everything sent so far, in the stored form."""
        return [r.to_json() for r in self.sent]
