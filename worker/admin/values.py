"""Values an admin gives as text (a command line, a field of an HTTP API request), parsed by
one rule each: ids, row limits, whole numbers in a range, times with a UTC offset.

Each parser takes the text and returns the value, or raises ``argparse.ArgumentTypeError``
with a message that reads after the flag or field's name (``expected at most 1000, got
5000``): argparse names the flag and exits 2; the HTTP API names the field and answers 400
(``worker.admin.requests.parsed``). One rule, one message, whichever way the value came.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = [
    "INT32_MAX",
    "LATEST_TIME",
    "MAX_ID",
    "MAX_LIMIT",
    "MAX_ROUNDS",
    "aware_datetime",
    "catch_up_window",
    "int_range",
    "iteration_ref",
    "limit",
    "parse_since",
    "positive_int",
    "row_id",
]

MAX_LIMIT = 10_000
MAX_ID = 2**63 - 1  # ids are BIGINT
INT32_MAX = 2**31 - 1
"""The largest value of a PostgreSQL ``integer`` column (counts and budgets of agents)."""
MAX_ROUNDS = 1_000
"""Most rounds an agent may run per iteration (each round is one LLM request)."""


def limit(text: str) -> int:
    """A row limit: a whole number from 1 to 10,000."""
    value = positive_int(text)
    if value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_LIMIT}, got {value}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (no upper bound: give the flag an ``int_range`` when its value
    reaches the database)."""
    try:
        value = _ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def int_range(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``; ``why`` says where the upper
    bound comes from (shown when it is exceeded). argparse names the flag in the message and
    exits 2, before anything reaches the database."""

    def parse(text: str) -> int:
        value = positive_int(text) if low == 1 else _whole_number(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a number >= {low}, got {value}")
        if value > high:
            reason = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(f"expected at most {high}{reason}, got {value}")
        return value

    parse.__name__ = f"number {low}-{high}"
    return parse


def _whole_number(text: str) -> int:
    try:
        return _ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]{1,40}", re.ASCII)
"""A whole number as people write it: ASCII digits, an optional sign (spaces around it are
trimmed); no underscores or other scripts' digits (both of which ``int`` takes: ``int('٣_0')``
is 30), at most 40 digits (every bound here has fewer)."""


def _ascii_int(text: str) -> int:
    """``int(text)`` of ``_WHOLE_NUMBER`` only. Raises ValueError for anything else."""
    text = text.strip(" \t")
    if _WHOLE_NUMBER.fullmatch(text) is None:
        raise ValueError(text)
    return int(text)


def row_id(text: str) -> int:
    """A database id: 1 to 2**63 - 1, in ASCII digits only (``int`` would also take
    ``'٣'``, ``' 3'``, ``'+3'`` or ``'0_3'`` for 3)."""
    try:
        if not text.isdigit():  # no sign, space or underscore; other scripts: below
            raise ValueError(text)
        value = _ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a numeric id, got {text!r}") from None
    if not 1 <= value <= MAX_ID:
        raise argparse.ArgumentTypeError(f"ids run from 1 to {MAX_ID}, got {value}")
    return value


def iteration_ref(text: str) -> int | None:
    """An iteration id, or ``latest`` (``None``)."""
    if text == "latest":
        return None
    if not text.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"expected an id or 'latest', got {text!r}")
    return row_id(text)


LATEST_TIME = datetime(9999, 1, 1, tzinfo=UTC)
"""Times given to mana-ai end before this (UTC): Python's last datetime, 9999-12-31
23:59:59.999999, is PostgreSQL's ``infinity`` to asyncpg (it reads back without an offset),
and a time near it cannot be shown in a timezone west of UTC."""


def aware_datetime(text: str) -> datetime:
    """An ISO 8601 time with a UTC offset, as UTC, before ``LATEST_TIME``; RFC 3339's
    lower-case ``t`` and ``z`` are taken as ``T`` and ``Z``."""
    try:
        value = datetime.fromisoformat(text[:-1] + "Z" if text.endswith("z") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ISO 8601 like 2026-12-01T09:00+01:00, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add one, e.g. +00:00")
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        value = LATEST_TIME
    if value >= LATEST_TIME:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range (times run to 9998-12-31 UTC)")
    return value


_SINCE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([dhms])\s*$", re.IGNORECASE | re.ASCII)
_MAX_SINCE = timedelta(days=3650)


def parse_since(text: str) -> timedelta:
    """``7d``, ``24h``, ``30m``, ``90s`` (positive, at most 10 years) as a timedelta.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    match = _SINCE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 7d, 24h, 30m or 90s, got {text!r}"
        )
    amount, unit = float(match.group(1)), match.group(2).lower()
    seconds = amount * {"d": 86_400, "h": 3_600, "m": 60, "s": 1}[unit]
    if not 0 < seconds <= _MAX_SINCE.total_seconds():
        raise argparse.ArgumentTypeError(
            f"expected a duration above 0 and up to 3650d, got {text!r}"
        )
    return timedelta(seconds=seconds)


_MAX_CATCH_UP_WINDOW = timedelta(days=30)


def catch_up_window(text: str) -> timedelta:
    """How far back a ``catch_up=all`` mission's missed runs still run: ``6h``, ``2d``,
    ``90m`` (from 1 minute to 30 days).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    window = parse_since(text)
    if not timedelta(minutes=1) <= window <= _MAX_CATCH_UP_WINDOW:
        raise argparse.ArgumentTypeError(
            f"expected a window from 1m to 30d (how far back missed runs still run), got {text!r}"
        )
    return window
