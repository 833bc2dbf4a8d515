"""Argument types and usage errors shared by the ``mana-ai`` command groups.

A value that does not parse is an ``argparse.ArgumentTypeError`` (argparse prints it and exits
2); a combination of flags that makes no sense is a ``UsageError`` raised by the command (the
entry point prints it and exits 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from worker.errors import ManaAIError
from worker.names import MAX_NAME_CHARS, MAX_TEXT_CHARS, normalised_name, normalised_text

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "INT32_MAX",
    "MAX_ID",
    "MAX_LIMIT",
    "MAX_NAME_CHARS",
    "MAX_ROUNDS",
    "MAX_TEXT_CHARS",
    "Command",
    "UsageError",
    "aware_datetime",
    "checked_name",
    "checked_text",
    "group",
    "int_range",
    "iteration_ref",
    "json_flag",
    "limit",
    "positive_int",
    "row_id",
]

Command = Callable[[argparse.Namespace, "Settings"], Awaitable[int]]
"""``async (args, settings) -> exit status``: what a subcommand's ``command_fn`` is."""

MAX_LIMIT = 10_000
MAX_ID = 2**63 - 1  # ids are BIGINT
INT32_MAX = 2**31 - 1
"""The largest value of a PostgreSQL ``integer`` column (counts and budgets of agents)."""
MAX_ROUNDS = 1_000
"""Most rounds an agent may run per iteration (each round is one LLM request)."""


class UsageError(ManaAIError):
    """A malformed or contradictory command line (exit status 2)."""


def checked_name(text: str, what: str) -> str:
    """The one rule for every name and id a command takes (agent names, user ids, model names,
    timezones, tools and scopes; ``worker.names.normalised_name``): trimmed, 1 to 200
    characters, no control or format characters (newlines, NUL, zero-width, bidi).

    Raises:
        UsageError: naming ``what`` (e.g. ``--owner``) and what is wrong.
    """
    try:
        return normalised_name(text)
    except ValueError as exc:
        raise UsageError(f"{what} {exc}") from None


def checked_text(text: str, what: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """The rule for free text a command takes (objectives, system prompts;
    ``worker.names.normalised_text``): trimmed, 1 to ``max_chars`` characters, newlines and
    tabs but no other control characters (ESC, BEL, …), no bidi embedding, override or isolate.

    Raises:
        UsageError: naming ``what`` (e.g. ``--objective``) and what is wrong (for a refused
            character: its code point, name, line and column).
    """
    try:
        return normalised_text(text, max_chars)
    except ValueError as exc:
        raise UsageError(f"{what} {exc}") from None


def group(commands: Any, name: str, helptext: str) -> Any:
    """A command group (``mana-ai NAME COMMAND``); returns its subparsers."""
    parser = commands.add_parser(name, help=helptext, description=helptext)
    return parser.add_subparsers(title="commands", metavar="COMMAND", required=True)


def json_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` (print JSON for scripts)."""
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


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
        value = int(text)
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
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def row_id(text: str) -> int:
    """A database id: 1 to 2**63 - 1."""
    try:
        value = int(text)
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


def aware_datetime(text: str) -> datetime:
    """An ISO 8601 time with a UTC offset."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ISO 8601 like 2026-12-01T09:00+01:00, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add one, e.g. +00:00")
    return value
