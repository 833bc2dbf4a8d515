"""The command line's value rules (``worker.names``, ``worker.admin.values``,
``worker.schedule``) written as JSON Schema, for the request bodies' models
(``worker.api.bodies``) and the query parameters of the OpenAPI document: what a schema
accepts, the server's rules accept too, as far as JSON Schema can say it (an ``at`` in the
past, a cron that never fires or a taken name are refused by the server alone).

Patterns are regular expressions both Python's ``re`` and ECMA-262 (with its ``u`` flag)
read: characters outside the BMP appear as themselves, the rest as ``\\uXXXX``.
"""

from __future__ import annotations

import unicodedata
from functools import cache
from typing import Any

from worker.admin.values import MAX_ID, MAX_LIMIT
from worker.names import MAX_NAME_CHARS, MAX_TEXT_CHARS
from worker.terminal_text import BIDI_CONTROLS

__all__ = [
    "DURATION",
    "ISO_TIME",
    "LIMIT",
    "ROW_ID",
    "choice",
    "cron",
    "integer",
    "name",
    "text",
    "timezone",
]

_NON_BLANK = r"(?=[\s\S]*\S)"
"""Something is left once the text is trimmed."""


def _char(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)


def _ranges(codes: list[int]) -> str:
    """A character class body for the sorted ``codes``, runs written as ranges."""
    parts: list[str] = []
    start = previous = codes[0]
    for code in [*codes[1:], -2]:
        if code == previous + 1:
            previous = code
            continue
        parts.append(_char(start) if start == previous else f"{_char(start)}-{_char(previous)}")
        start = previous = code
    return "".join(parts)


@cache
def _name_pattern() -> str:
    """``worker.names.normalised_name``: no control, format, surrogate or private-use
    character, not blank."""
    refused = [
        c for c in range(0x110000) if unicodedata.category(chr(c)) in ("Cc", "Cf", "Cs", "Co")
    ]
    return f"^{_NON_BLANK}[^{_ranges(refused)}]*$"


@cache
def _text_pattern() -> str:
    """``worker.names.normalised_text``: newlines and tabs (CR only before LF), no other
    control character, no bidi control, no lone surrogate, not blank."""
    refused = sorted(
        {c for c in range(0xA0) if unicodedata.category(chr(c)) == "Cc"} - {0x09, 0x0A}
        | {ord(c) for c in BIDI_CONTROLS}
        | set(range(0xD800, 0xE000))
    )
    return f"^{_NON_BLANK}(?:[^{_ranges(refused)}]|\\r\\n)*$"


def name(schema: dict[str, Any]) -> None:
    """A name's rule (an agent, an owner, a model), added to a field's ``schema``."""
    schema.update(pattern=_name_pattern(), maxLength=MAX_NAME_CHARS)


def text(max_chars: int = MAX_TEXT_CHARS) -> Any:
    """Free text's rule (an objective, a prompt, a note) of up to ``max_chars`` characters."""

    def add(schema: dict[str, Any]) -> None:
        schema.update(pattern=_text_pattern(), maxLength=max_chars)

    return add


ISO_TIME = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}(:[0-9]{2}(:[0-9]{2}([.,][0-9]+)?)?)?"
    r"([Zz]|[+-][0-9]{2}(:?[0-9]{2}(:?[0-9]{2}([.,][0-9]+)?)?)?)$"
)
"""An ISO 8601 time with its UTC offset (``2026-12-01T09:00+01:00``), as
``datetime.fromisoformat`` reads it with one."""

DURATION = r"^\s*[0-9]+(\.[0-9]+)?\s*[dhmsDHMS]\s*$"
"""A duration of ``worker.admin.values.parse_since``: ``7d``, ``24h``, ``30m``, ``90s``."""


def _names(*names: str) -> str:
    """Three-letter names in any case, as character classes (ECMA-262 has no inline flag)."""
    return "|".join("".join(f"[{c.upper()}{c}]" for c in name) for name in names)


_CRON_VALUES = (
    r"0*(?:[1-5]?[0-9])",  # minute 0-59
    r"0*(?:1?[0-9]|2[0-3])",  # hour 0-23
    r"0*(?:[1-9]|[12][0-9]|3[01])",  # day of month 1-31
    r"0*(?:[1-9]|1[0-2])|" + _names(*"jan feb mar apr may jun jul aug sep oct nov dec".split()),
    r"0*[0-7]|" + _names(*"sun mon tue wed thu fri sat".split()),  # day of week, 0 and 7 Sunday
)
"""Each cron field's values (``worker.schedule``: numbers in range, the names of months and
days)."""


def _cron_field(value: str) -> str:
    element = rf"(?:\*|(?:{value})(?:-(?:{value}))?)(?:/0*[1-9][0-9]*)?"
    return f"{element}(?:,{element})*"


def cron(schema: dict[str, Any]) -> None:
    """Five cron fields of the values each takes, in lists, ranges and steps
    (``worker.schedule`` refuses the rest: a range that runs backwards, a date that never
    comes)."""
    fields = r"\s+".join(_cron_field(v) for v in _CRON_VALUES)
    schema.update(pattern=rf"^\s*{fields}\s*$")


def timezone(schema: dict[str, Any]) -> None:
    """An IANA time zone this server knows (``zoneinfo``)."""
    schema.update(enum=[*_zones(), *([None] if _nullable(schema) else [])])


@cache
def _zones() -> tuple[str, ...]:
    from zoneinfo import available_timezones

    return tuple(sorted(available_timezones() | {"UTC"}))


def _nullable(schema: dict[str, Any]) -> bool:
    return any(s.get("type") == "null" for s in schema.get("anyOf", []))


def integer(low: int, high: int) -> Any:
    """Whole numbers from ``low`` to ``high``."""

    def add(schema: dict[str, Any]) -> None:
        schema.update(minimum=low, maximum=high)

    return add


def choice(*values: str) -> Any:
    """One of ``values`` (or ``null`` where the field may be null)."""

    def add(schema: dict[str, Any]) -> None:
        schema.update(enum=[*values, *([None] if _nullable(schema) else [])])

    return add


ROW_ID: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
LIMIT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}
