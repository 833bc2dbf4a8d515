"""The one rule for names and for free text that operators give mana-ai.

A *name* (agent name, user id, model name, timezone, tool or scope, worker id) is trimmed,
1 to ``MAX_NAME_CHARS`` characters, without control or format characters (newlines, NUL,
zero-width and bidi marks) or unpaired surrogates (what undecodable bytes on a command line
become). *Text* (an objective, a system prompt) is trimmed, 1 to ``MAX_TEXT_CHARS``
characters, and may hold newlines and tabs but no other control characters (PostgreSQL text
cannot hold NUL; ESC and the rest drive or hide from a terminal: in an objective they are a
pasted mistake or an attack on whoever reads it), no bidi embedding, override or isolate
(``worker.terminal_text.BIDI_CONTROLS``: they make the text read in another order than it is
stored, what the names rule refuses them for) and no unpaired surrogate. Other format
characters stay allowed in text, as languages and emoji need them (the zero-width joiner and
non-joiner, the bidi marks of right-to-left prose); commands show them escaped.

Both raise ``ValueError`` with a message that reads after the thing's name ("must not be
empty"), so that callers can say what was wrong: the command line (``worker.cli.args``) as a
usage error naming the flag, the settings as a ``SettingsError`` naming the variable.
"""

from __future__ import annotations

import unicodedata

from worker.errors import UsageError
from worker.terminal_text import BIDI_CONTROLS, describe_char

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_TEXT_CHARS",
    "checked_name",
    "checked_text",
    "normalised_name",
    "normalised_text",
]

MAX_NAME_CHARS = 200
"""Longest name: fits any index (PostgreSQL's btree rows stop near 2.7 kB) and any terminal
line."""

MAX_TEXT_CHARS = 20_000
"""Longest objective or system prompt: about 5,000 tokens, sent with every request of a run
(the embedded model's whole context is 2,048 tokens)."""

_NAME_REFUSED = ("Cc", "Cf", "Cs", "Co")  # control, format, surrogate, private use
_TEXT_ALLOWED = frozenset("\n\t")


def normalised_name(text: str) -> str:
    """``text`` trimmed, if it is a valid name.

    Raises:
        ValueError: empty, longer than ``MAX_NAME_CHARS``, or holding a control or invisible
            character (the message quotes it).
    """
    value = text.strip()
    if not value:
        raise ValueError("must not be empty")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"is {len(value)} characters long; at most {MAX_NAME_CHARS}")
    bad = next((c for c in value if unicodedata.category(c) in _NAME_REFUSED), None)
    if bad is not None:
        raise ValueError(f"must not contain control or invisible characters ({bad!r})")
    return value


def normalised_text(text: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """``text`` trimmed (line ends as ``\\n``), if it is valid free text (module docstring).

    Raises:
        ValueError: empty, longer than ``max_chars``, or holding a control character other
            than newline and tab, a bidi control or an unpaired surrogate; the message names
            the character and where it is, e.g. ``must not contain bidi controls (U+202E
            RIGHT-TO-LEFT OVERRIDE at line 2, column 7) …``.
    """
    value = text.replace("\r\n", "\n").strip()
    if not value:
        raise ValueError("must not be empty")
    if len(value) > max_chars:
        raise ValueError(f"is {len(value):,} characters long; at most {max_chars:,}")
    for at, char in enumerate(value):
        if char in _TEXT_ALLOWED:
            continue
        category = unicodedata.category(char)
        if category == "Cc":
            what = "control characters other than newline and tab"
            why = "a terminal acts on them (ESC, BEL) instead of showing them"
        elif char in BIDI_CONTROLS:
            what = "bidi embeddings, overrides or isolates"
            why = "they show the text in another order than it is stored"
        elif category == "Cs":
            what = "undecodable bytes"
            why = "give the text as UTF-8"
        else:
            continue
        raise ValueError(
            f"must not contain {what} ({describe_char(char)} at {_where(value, at)}): {why}"
        )
    return value


def _where(text: str, at: int) -> str:
    """``line L, column C`` of the character at index ``at`` of ``text`` (both from 1)."""
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"line {line}, column {column}"


def checked_name(text: str, what: str) -> str:
    """The one rule for every name and id an admin gives (agent names, user ids, model names,
    timezones, tools and scopes; ``normalised_name``): trimmed, 1 to 200 characters, no
    control or format characters (newlines, NUL, zero-width, bidi).

    Raises:
        UsageError: naming ``what`` (a flag such as ``--owner``, or an API field) and what is
            wrong.
    """
    try:
        return normalised_name(text)
    except ValueError as exc:
        raise UsageError(f"{what} {exc}") from None


def checked_text(text: str, what: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """The rule for free text an admin gives (objectives, system prompts;
    ``normalised_text``): trimmed, 1 to ``max_chars`` characters, newlines and tabs but no
    other control characters (ESC, BEL, …), no bidi embedding, override or isolate.

    Raises:
        UsageError: naming ``what`` and what is wrong (for a refused character: its code
            point, name, line and column).
    """
    try:
        return normalised_text(text, max_chars)
    except ValueError as exc:
        raise UsageError(f"{what} {exc}") from None
