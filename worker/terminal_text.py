"""Text that is safe on a terminal: which characters must never reach one raw, and how mana-ai
shows them instead.

Objectives, prompts, model replies, tool results, MCP servers' answers and anything else a
database row or a peer holds may carry characters that a terminal acts on rather than shows:
ESC starts sequences that set the window title, clear the screen, colour or move the cursor,
BEL rings, U+009B (CSI) is ESC [ on terminals that read C1 controls, and the bidi controls
show text in another order than it is stored (the "Trojan Source" characters,
CVE-2021-42574). A character is *hidden* (``is_hidden``) when its Unicode category is

* ``Cc`` control: C0 (U+0000-U+001F), DEL (U+007F), C1 (U+0080-U+009F);
* ``Cf`` format: bidi embeddings, overrides and isolates (``BIDI_CONTROLS``), bidi marks
  (U+200E, U+200F, U+061C), zero-width characters, the soft hyphen, tag characters;
* ``Cs`` surrogate (what undecodable bytes become), ``Co`` private use;
* ``Zl`` / ``Zp``: the line and paragraph separators U+2028 / U+2029.

``visible`` writes each hidden character as an escape an admin can see: ``\\n``, ``\\t``,
``\\r`` for those three, ``\\uXXXX`` for the rest of the Basic Multilingual Plane (``\\u001b``
for ESC, ``\\u202e`` for RIGHT-TO-LEFT OVERRIDE), ``\\UXXXXXXXX`` above it. ``visible_json``
is JSON with every hidden character as a JSON ``\\u`` escape (a surrogate pair above the
BMP), so it parses back to the very same value and still shows nothing hidden when piped to a
terminal. ``describe_char`` names a character for an error message (``U+202E RIGHT-TO-LEFT
OVERRIDE``).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

__all__ = [
    "BIDI_CONTROLS",
    "describe_char",
    "is_hidden",
    "visible",
    "visible_json",
    "visible_line",
]

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
"""The Unicode general categories of the characters ``visible`` escapes."""

BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""The bidi embeddings (LRE, RLE, PDF), overrides (LRO, RLO) and isolates (LRI, RLI, FSI,
PDI): the characters that reorder how the text after them is displayed, as the Trojan
Source paper lists them (Boucher and Anderson, 2021) and rustc's
``text_direction_codepoint_in_literal`` lint refuses. The bidi *marks* (LRM, RLM, ALM) only
set the direction of neutral characters next to them and are common in right-to-left prose."""

_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_C0_NAMES = (
    "NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI "
    "DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC FS GS RS US"
).split()


def is_hidden(char: str) -> bool:
    """Whether the one character ``char`` must not reach a terminal raw (see the module
    docstring)."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def visible(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with every hidden character but those in ``keep`` (default: newline and tab,
    for text shown over several lines) written as an escape: ``\\u001b``, ``\\u202e``,
    ``\\U000e0001``; ``\\n``, ``\\t``, ``\\r`` when they are not kept. Other text, accents and
    emoji included, is unchanged."""
    if text.isprintable() or _printable_but(text, keep):
        return text
    return "".join(c if c in keep or not is_hidden(c) else _escape(c) for c in text)


def visible_line(text: str) -> str:
    """``visible`` for a value shown on one line (a table cell, a field in a sentence): newlines
    and tabs are escapes too (``\\n``, ``\\t``), so the value cannot break the line or fake
    another."""
    return visible(text, keep="")


def visible_json(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **dumps)`` with every hidden character written
    as a JSON escape (``\\u001b``, ``\\u202e``; a surrogate pair above U+FFFF). It parses back
    to ``value``; non-ASCII text (accents, CJK, emoji) stays readable.

    Raises:
        TypeError, ValueError: as ``json.dumps`` does for a value it cannot encode.
    """
    text = json.dumps(value, ensure_ascii=False, **dumps)
    if _printable_but(text, "\n"):
        return text
    # json.dumps escapes newlines (and every other C0 control) inside strings, so a raw one is
    # indentation; any other hidden character is inside a string, where a \u escape means the
    # very same character
    return "".join(_json_escape(c) if c != "\n" and is_hidden(c) else c for c in text)


def describe_char(char: str) -> str:
    """The one character ``char`` named for a message: ``U+202E RIGHT-TO-LEFT OVERRIDE``,
    ``U+001B ESC``, ``U+DCFF`` (a character without a name)."""
    code = ord(char)
    if code < 0x20:
        name = _C0_NAMES[code]
    elif code == 0x7F:
        name = "DEL"
    else:
        name = unicodedata.name(char, "")
    return f"U+{code:04X} {name}".rstrip()


def _printable_but(text: str, keep: str) -> bool:
    """Whether ``text`` is printable once the characters of ``keep`` are taken out (a fast
    path in C for the usual text with newlines)."""
    for char in keep:
        text = text.replace(char, "")
    return text.isprintable()


def _escape(char: str) -> str:
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
