"""``json_text``: a value as the JSON text the planner sends and estimates, made once per value;
``storable_text`` / ``storable_json``: text as every store can hold it.

It is ``json.dumps(value, ensure_ascii=False, default=str)`` (compact separators ``", "`` and
``": "``, non-ASCII kept, anything JSON has no type for written as its ``str``): every tool
result and the arguments of every call go through it. ``json.dumps`` with options builds an
encoder per call, and even a prebuilt ``json.JSONEncoder`` builds its C encoder per value
(with a fresh dictionary for finding circular references); here the C encoder is built once,
without that check, and a value it cannot encode (a circular one runs into the recursion
limit, a key JSON cannot have) is encoded again the standard way, which raises what
``json.dumps`` raises (``ValueError: Circular reference detected``, ``TypeError``,
``RecursionError``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json import encoder as _json_encoder
from typing import Any

__all__ = ["compact_encoder", "json_text", "storable_json", "storable_text"]

_STANDARD = json.JSONEncoder(ensure_ascii=False, default=str)
"""The standard encoder with the same options: the reference, and the fallback."""

_C_MAKE_ENCODER: Any = getattr(_json_encoder, "c_make_encoder", None)


def compact_encoder(
    default: Callable[[Any], Any], *, allow_nan: bool
) -> Callable[[Any, int], list[str]] | None:
    """CPython's C JSON encoder, built once: ``"".join(encoder(value, 0))`` is what
    ``json.JSONEncoder(ensure_ascii=False, allow_nan=allow_nan, default=default,
    check_circular=False).encode(value)`` writes for a ``dict`` or ``list`` (separators
    ``", "`` and ``": "``, non-ASCII kept), without building an encoder per value (and
    without a Python frame of its own: a caller reaches as deep a structure as
    ``json.dumps`` from the same place). A value that contains itself ends in
    ``RecursionError``; NaN and infinities raise ``ValueError`` unless ``allow_nan``; other
    types go to ``default``. ``None`` where the C encoder is missing (another Python
    implementation)."""
    if _C_MAKE_ENCODER is None:
        return None
    encoder: Callable[[Any, int], list[str]] = _C_MAKE_ENCODER(
        None,  # no circular-reference bookkeeping
        default,
        _json_encoder.encode_basestring,
        None,
        _STANDARD.key_separator,
        _STANDARD.item_separator,
        False,
        False,
        allow_nan,
    )
    return encoder


_FAST = compact_encoder(str, allow_nan=True)


def json_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, default=str)``: the same text, or the same
    exception (``ValueError``, ``TypeError``, ``RecursionError``, or what a ``__str__``
    raises)."""
    if _FAST is not None:
        try:
            return "".join(_FAST(value, 0))
        except Exception:  # let the standard encoder say what is wrong with it
            pass
    return _STANDARD.encode(value)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with what no store can hold replaced by U+FFFD: NUL (PostgreSQL's ``text``
    and ``jsonb`` refuse it) and lone UTF-16 surrogates (not Unicode scalar values: UTF-8,
    and so every encoder, refuses them). A model or a peer can send either as a JSON escape
    (``\\u0000``, ``\\ud800``). Text enters the record this way once
    (``planner.messages``), so the call that runs, the call that is stored and the hash a
    person's approval is bound to (``planner.approvals.arguments_hash``) are the same."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def storable_json(value: Any) -> Any:
    """``value`` with ``storable_text`` applied to every string in it, dictionary keys
    included (dicts, lists and tuples are rebuilt; other values are returned as they are).
    A structure nested too deeply to walk is returned as it is (no encoder can write it
    either: the store keeps a note in its place)."""
    try:
        return _storable_json(value)
    except RecursionError:
        return value


def _storable_json(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {
            (storable_text(k) if isinstance(k, str) else k): _storable_json(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_storable_json(v) for v in value]
    return value
