"""Tool-call arguments in the encodings real endpoints send, decoded before they are judged.

The Chat Completions API says ``function.arguments`` is a JSON string holding an object. What
arrives instead (shapes from public bug reports of agent runtimes against vLLM, Ollama,
LiteLLM, OpenRouter and Gemini's compatibility layer), each decoded here:

* an object that is already decoded (``{"title": "time"}``);
* JSON text of JSON text: a JSON string whose value is the object's JSON text (sent by some
  proxies that encode the arguments twice), up to ``MAX_NESTING`` levels deep;
* empty or blank text, ``null``, ``None``, ``{}`` or ``""``: no arguments (a tool that needs
  some then fails its schema check with a message naming the missing property);
* the JSON inside a Markdown code fence (```` ```json … ``` ````);
* a Python dict literal (``{'title': 'time'}``), read with ``ast.literal_eval``, which
  evaluates literals only and runs nothing.

Anything else is a parse error that the model reads as the call's tool result; when the reply
was cut at the output-token limit the error says so, since the model can fix that one.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_NESTING", "decode_arguments", "nesting_depth"]

MAX_NESTING = 3
"""How many layers of JSON-text-in-JSON-text are unwrapped before giving up."""

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in arguments. Real tool arguments are a few
levels deep; hundreds of levels only break what reads them later (encoders, validators and
storage are recursive), so deeper arguments are a parse error the model reads."""

_LITERAL_MAX_CHARS = 100_000
"""Longest text handed to ``ast.literal_eval`` (its parser is recursive)."""

_NO_ARGUMENTS = frozenset({"", "null", "none", "{}", '""', "''"})
_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


def decode_arguments(raw: Any, *, truncated: bool = False) -> tuple[dict[str, Any], str | None]:
    """``(arguments, parse_error)`` for one tool call's ``function.arguments``.

    Args:
        raw: the value as received: a string (the documented form), an object, ``None``, …
        truncated: the reply stopped at the output-token limit (``finish_reason`` ``length``);
            an undecodable text is then reported as cut off.

    Returns:
        The arguments object and ``None``, or ``{}`` and a one-line error for the model.
    """
    value: Any = raw
    for _ in range(MAX_NESTING + 1):
        if value is None:
            return {}, None
        if isinstance(value, dict):
            if nesting_depth(value, MAX_DEPTH) > MAX_DEPTH:
                return {}, _too_deep()
            return value, None
        if not isinstance(value, str):
            return {}, f"arguments must be a JSON object, got {_json_type(value)}"
        text = value.strip().lstrip("\ufeff")  # a byte-order mark is no JSON
        if text.lower() in _NO_ARGUMENTS:
            return {}, None
        fenced = _FENCE.match(text)
        if fenced is not None:
            text = fenced.group(1).strip()
        try:
            value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
        except RecursionError:
            return {}, _too_deep()
        except _NonFiniteNumber as exc:
            return {}, f"arguments hold {exc}, which JSON does not allow; send a number"
        except json.JSONDecodeError as exc:
            literal = _python_literal(text)
            if literal is not None:
                return literal, None
            if truncated:
                return {}, (
                    "your output was cut off at the output-token limit in the middle of these "
                    "arguments, so they are incomplete JSON "
                    f"({exc.msg}, position {exc.pos}); call the tool again with shorter "
                    "arguments"
                )
            return {}, f"arguments are not valid JSON: {exc.msg} (position {exc.pos})"
        if not isinstance(value, str | dict):
            return {}, f"arguments must be a JSON object, got {_json_type(value)}"
    return {}, f"arguments are JSON text nested more than {MAX_NESTING} levels deep"


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep objects and arrays nest in ``value`` (a scalar is 0, ``{}`` is 1), counted
    without recursion and only up to ``limit + 1``: deeper values report ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return limit + 1
        stack.extend((child, depth + 1) for child in children)
    return deepest


class _NonFiniteNumber(ValueError):
    """NaN or an infinity in arguments: Python's JSON reader accepts them, JSON does not, and
    neither can PostgreSQL store them."""


def _no_constant(name: str) -> Any:
    raise _NonFiniteNumber(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFiniteNumber(text)
    return value


def _too_deep() -> str:
    return f"arguments are nested more than {MAX_DEPTH} levels deep; send a flatter object"


def _python_literal(text: str) -> dict[str, Any] | None:
    """A dict from a Python literal with string keys and JSON-compatible values, or ``None``."""
    if not text.startswith("{") or len(text) > _LITERAL_MAX_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
        json.dumps(value)  # sets, bytes, complex numbers are not arguments
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        return None
    return value


def _json_type(value: Any) -> str:
    return {
        list: "an array",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
    }.get(type(value), type(value).__name__)
