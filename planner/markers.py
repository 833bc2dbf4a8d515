"""Prompt-injection markers in a tool call's arguments: found, never blocked.

``find_injection_markers`` scans every string of the arguments, at any depth (keys included),
for the configured markers, robust to case, runs of whitespace, zero-width and other format
characters, combining marks, Unicode compatibility forms (NFKC: full-width letters and
brackets) and a few bracket look-alikes (``normalize_for_markers``). The scan is bounded
(characters and values visited), so arguments of 10 MB or 10,000 levels deep are scanned in
bounded time, and say so when they were not read whole.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

__all__ = [
    "DEFAULT_INJECTION_MARKERS",
    "MAX_INSPECTED_CHARS",
    "MAX_INSPECTED_NODES",
    "CompiledMarkers",
    "compile_markers",
    "find_injection_markers",
    "normalize_for_markers",
    "scan_for_markers",
]

DEFAULT_INJECTION_MARKERS: tuple[str, ...] = (
    "{{",
    "<system",
    "ignore previous",
    "ignore all previous",
)
"""The seed design's markers (template injection, fake system tags, the classic override) and
the override's most common wording."""

MAX_INSPECTED_CHARS = 65_536
"""Characters of a call's strings scanned for markers (all strings together); the rest is not
read and the decision carries ``inspection_truncated``."""

MAX_INSPECTED_NODES = 10_000
"""Values (strings, numbers, containers) of a call's arguments visited at most."""


# Look-alikes that NFKC leaves alone but a reader (or a model) takes for the ASCII character.
_LOOKALIKES = str.maketrans(
    {
        "\u2039": "<",  # single left-pointing angle quotation mark
        "\u2329": "<",  # left-pointing angle bracket
        "\u27e8": "<",  # mathematical left angle bracket
        "\u3008": "<",  # CJK left angle bracket
        "\u276e": "<",  # heavy left-pointing angle quotation mark ornament
        "\u02c2": "<",  # modifier letter left arrowhead
        "\u2774": "{",  # medium left curly bracket ornament
        "\u2983": "{",  # left white curly bracket
        # Cyrillic and Greek letters that look like Latin ones.
        "\u0430": "a",
        "\u0435": "e",
        "\u043e": "o",
        "\u0440": "p",
        "\u0441": "c",
        "\u0443": "y",
        "\u0445": "x",
        "\u0456": "i",
        "\u0455": "s",
        "\u0458": "j",
        "\u04bb": "h",
        "\u0501": "d",
        "\u03bf": "o",
        "\u03b9": "i",
        "\u03bd": "v",
        "\u03c1": "p",
        "\u0442": "t",
        "\u043c": "m",
        "\u0433": "r",
        "\u0131": "i",  # dotless i
        # small capitals
        "\u1d00": "a",
        "\u0299": "b",
        "\u1d04": "c",
        "\u1d05": "d",
        "\u1d07": "e",
        "\ua730": "f",
        "\u0262": "g",
        "\u029c": "h",
        "\u026a": "i",
        "\u1d0a": "j",
        "\u1d0b": "k",
        "\u029f": "l",
        "\u1d0d": "m",
        "\u0274": "n",
        "\u1d0f": "o",
        "\u1d18": "p",
        "\u0280": "r",
        "\ua731": "s",
        "\u1d1b": "t",
        "\u1d1c": "u",
        "\u1d20": "v",
        "\u1d21": "w",
        "\u028f": "y",
        "\u1d22": "z",
    }
)


def normalize_for_markers(text: str, format_as_space: bool = False) -> str:
    """``text`` in the form markers are matched in: compatibility-decomposed (NFKD), without
    format characters (zero-width spaces and joiners, soft hyphens, bidi controls: category
    ``Cf``; with ``format_as_space`` they become spaces instead, for text that uses them as
    word breaks), control characters other than whitespace and combining marks, recomposed
    (NFKC), case-folded, look-alike brackets and letters (Cyrillic, Greek, small capitals,
    dotless i) mapped to ASCII, and every run of whitespace turned into one space."""
    if text.isascii() and _CONTROL.search(text) is None:
        return " ".join(text.lower().split())
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(_keep(ch, format_as_space) for ch in decomposed)
    folded = unicodedata.normalize("NFKC", kept).casefold().translate(_LOOKALIKES)
    return " ".join(folded.split())


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""ASCII control characters other than whitespace: dropped before matching."""


def _keep(ch: str, format_as_space: bool) -> str:
    category = unicodedata.category(ch)
    if category == "Cf":
        return " " if format_as_space else ""
    if category in ("Mn", "Me", "Cs") or (category == "Cc" and not ch.isspace()):
        return ""
    return ch


CompiledMarkers = tuple[tuple[str, str, str], ...]
"""Markers as the scan matches them: ``(marker, normalized, first word)`` each."""


@lru_cache(maxsize=64)
def compile_markers(markers: tuple[str, ...]) -> CompiledMarkers:
    """``(marker, normalized, first word)`` of each of ``markers`` that normalizes to
    something (``normalize_for_markers``), in order; cached for the last 64 tuples."""
    pairs = ((m, normalize_for_markers(m)) for m in markers)
    return tuple((m, n, n.split(" ", 1)[0]) for m, n in pairs if n)


def _matches(texts: list[str], wanted: CompiledMarkers) -> tuple[str, ...]:
    """The markers of ``wanted`` that one of ``texts`` holds once normalized, in ``wanted``
    order. The texts are joined with a separator no marker can match across.

    Plain ASCII text (the common case) is not normalized as a whole: lower-casing is enough for
    a marker without spaces (collapsing whitespace cannot create or split a run without
    whitespace), and a marker with spaces is only looked for after its first word was found.
    """
    plain = True
    for text in texts:
        # printable ASCII has no control character: the search is for the rest
        if not text.isascii() or (not text.isprintable() and _CONTROL.search(text) is not None):
            plain = False
            break
    if plain:
        low = texts[0].lower() if len(texts) == 1 else "\x00".join(texts).lower()
        collapsed: str | None = None
        found: list[str] = []
        for original, normalized, first in wanted:
            if first not in low:
                continue
            if first != normalized:
                if collapsed is None:
                    collapsed = " ".join(low.split())
                if normalized not in collapsed:
                    continue
            found.append(original)
        return tuple(found)
    joined = "\uffff".join(texts)  # a noncharacter: kept by the normalization, in no marker
    forms = (normalize_for_markers(joined), normalize_for_markers(joined, format_as_space=True))
    return tuple(
        original for original, normalized, _ in wanted if any(normalized in f for f in forms)
    )


_SCALARS = (int, float, bool, type(None))


def _flat_texts(value: dict[Any, Any], max_chars: int) -> list[str] | None:
    """The keys and string values of an object without nested containers whose text fits
    ``max_chars``; ``None`` when it is not that simple (the full scan handles it)."""
    texts: list[str] = []
    size = 0
    for key, inner in value.items():
        if type(key) is not str:
            return None
        texts.append(key)
        size += len(key)
        kind = type(inner)
        if kind is str:
            texts.append(inner)
            size += len(inner)
        elif kind not in _SCALARS:
            return None
    return texts if size <= max_chars else None


def find_injection_markers(
    value: Any,
    markers: Iterable[str] = DEFAULT_INJECTION_MARKERS,
    *,
    max_chars: int = MAX_INSPECTED_CHARS,
    max_nodes: int = MAX_INSPECTED_NODES,
) -> tuple[tuple[str, ...], bool, bool]:
    """Scan every string in ``value`` (dict keys and values, list items, at any depth).

    Returns:
        ``(found, truncated, not_object)``: the markers found (as given, in ``markers`` order),
        whether the scan stopped early (more than ``max_chars`` characters or ``max_nodes``
        values), and whether ``value`` is not a dict (tool arguments should be an object).

    Never raises; iterative (no recursion), so nesting depth costs nothing extra.
    """
    wanted = compile_markers(markers if isinstance(markers, tuple) else tuple(markers))
    return scan_for_markers(value, wanted, max_chars=max_chars, max_nodes=max_nodes)


def scan_for_markers(
    value: Any, wanted: CompiledMarkers, *, max_chars: int, max_nodes: int
) -> tuple[tuple[str, ...], bool, bool]:
    """``find_injection_markers`` with the markers compiled already (``compile_markers``):
    for a caller that scans many values for the same markers. Same result, never raises."""
    if type(value) is dict and len(value) < max_nodes:
        texts = _flat_texts(value, max_chars)
        if texts is not None:  # the common case: an object of short strings and numbers
            return (_matches(texts, wanted) if texts else ()), False, False
    not_object = not isinstance(value, dict)
    texts = []
    budget = max_chars
    nodes = 0
    truncated = False
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            truncated = True
            break
        if isinstance(item, str):
            if len(item) >= budget:
                truncated = truncated or len(item) > budget
                texts.append(item[:budget])
                budget = 0
                if stack:
                    truncated = True
                break
            budget -= len(item)
            texts.append(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                stack.append(inner)
                stack.append(key)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    if not texts:
        return (), truncated, not_object
    return _matches(texts, wanted), truncated, not_object
