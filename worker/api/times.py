"""Times as the console shows them: one format everywhere (``2026-12-03 16:05:09 UTC``), a
mission's schedule time in its own zone beside it (``2026-12-03 17:05:09 CET``), and
durations in words a person reads (``3.2 s``, ``4 min 03 s``, ``2 h 05 min``). Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from worker.schedule import in_zone

__all__ = ["duration", "in_zone", "local_when", "when"]

FORMAT = "%Y-%m-%d %H:%M:%S"
"""The one format of a time in the console, followed by its zone's abbreviation."""


def when(value: Any) -> str:
    """``value`` (an aware datetime, or one in ISO 8601 text as JSON columns hold them) in UTC,
    as ``2026-12-03 16:05:09 UTC``; ``-`` for ``None``; anything else as text."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
        if value.tzinfo is None:
            return str(value.strftime(FORMAT))
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime(f"{FORMAT} UTC")
    return "-" if value is None else str(value)


def local_when(value: Any, zone: Any) -> str | None:
    """``value`` in the mission's zone ``zone``, in the console's format with the zone's
    abbreviation (``2026-12-03 17:05:09 CET``); ``None`` as ``in_zone`` says."""
    local = in_zone(value, zone)
    return None if local is None else local.strftime(f"{FORMAT} %Z")


def duration(start: Any, end: Any) -> str:
    """The time from ``start`` to ``end`` (datetimes; a ``timedelta`` as ``start`` alone) in
    words: ``850 ms``, ``3.2 s``, ``4 min 03 s``, ``2 h 05 min``; ``-`` when either is
    missing."""
    if isinstance(start, timedelta):
        span = start
    elif isinstance(start, datetime) and isinstance(end, datetime):
        span = end - start
    else:
        return "-"
    seconds = max(span.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
