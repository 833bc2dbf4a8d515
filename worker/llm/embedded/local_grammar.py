"""The reply format of the embedded model, as the JSON schema that llama.cpp's grammar
(GBNF, ``llama_cpp.LlamaGrammar.from_json_schema``) forces every reply into::

    {"tool_calls": [{"name": "<a tool name>", "arguments": {<that tool's input_schema>}}, ...]}
    {"answer": "<text>"}

Each tool's parameters schema is adapted to what the converter takes and a 135M-parameter
model can complete (``arguments_schema``): bounded strings, whole-string patterns only.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from typing import Any

from planner.llm import ToolChoice

__all__ = [
    "ANSWER_CHARS",
    "ARGUMENT_STRING_CHARS",
    "DEFAULT_MAX_TOOL_CALLS",
    "arguments_schema",
    "reply_schema",
    "tool_function",
]

DEFAULT_MAX_TOOL_CALLS = 1
"""Tool calls the grammar allows per reply by default. With 3, SmolLM2-135M fills the extra
slots with junk calls (a second note about nothing, an unasked notes_list) and takes ~2x longer."""

ARGUMENT_STRING_CHARS = 160
"""Longest string the grammar lets the model write in a tool argument (unless the schema says).

A 135M model easily repeats a phrase until ``max_tokens`` runs out, which cuts the JSON;
bounding strings keeps every reply complete and parseable."""

ANSWER_CHARS = 600
"""Longest text answer the grammar allows, for the same reason."""


def tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    """The ``function`` of an OpenAI-format tool (or the tool itself, when it is one)."""
    function = tool.get("function", tool)
    return function if isinstance(function, dict) else {}


def reply_schema(
    tools: Sequence[dict[str, Any]],
    tool_choice: ToolChoice,
    *,
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
    loose_tools: Collection[str] = (),
) -> dict[str, Any]:
    """The JSON schema every reply is forced into, for OpenAI-format ``tools``.

    One ``anyOf`` branch per tool (``name`` as a const, ``arguments`` as its parameters schema
    adapted by ``_bounded``; any object for the tools named in ``loose_tools``) inside
    ``{"tool_calls": [1..max_tool_calls calls]}``, or ``{"answer": "<text>"}``. With no tools
    or ``tool_choice="none"`` only the answer is allowed; with ``"required"`` only tool calls.
    """
    answer = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": ANSWER_CHARS}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    branches = []
    for tool in tools:
        function = tool_function(tool)
        name = function.get("name")
        if not isinstance(name, str):
            continue
        branches.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    "arguments": (
                        arguments_schema(function.get("parameters"))
                        if name not in loose_tools
                        else {"type": "object"}
                    ),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not branches or tool_choice == "none":
        return answer
    calls = {
        "type": "object",
        "properties": {
            "tool_calls": {
                "type": "array",
                "items": branches[0] if len(branches) == 1 else {"anyOf": branches},
                "minItems": 1,
                "maxItems": max_tool_calls,
            }
        },
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    if tool_choice == "required":
        return calls
    return {"anyOf": [calls, answer]}


def arguments_schema(parameters: Any) -> dict[str, Any]:
    """A tool's parameters schema as the grammar should see it.

    An object schema without ``properties`` means any object; one with properties gets
    ``additionalProperties: false`` unless it says otherwise (so the model cannot invent keys).
    """
    if not isinstance(parameters, dict) or not parameters:
        return {"type": "object"}
    schema: dict[str, Any] = copy.deepcopy(parameters)
    _bounded(schema)
    schema.pop("$schema", None)
    if "properties" in schema:
        schema.setdefault("additionalProperties", False)
        if not schema["properties"]:
            return {"type": "object", "properties": {}, "additionalProperties": False}
    return schema


def _bounded(schema: Any) -> None:
    """Make a copied parameters schema fit the grammar converter and a small model (in place).

    Free strings get ``maxLength <= ARGUMENT_STRING_CHARS``. Unanchored ``pattern``s are dropped:
    JSON Schema patterns match anywhere (``\\S`` = "not only spaces") while llama.cpp's
    converter only takes ``^…$`` whole-string patterns; the loop still validates the arguments
    against the tool's real schema.
    """
    if isinstance(schema, list):
        for item in schema:
            _bounded(item)
        return
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not (pattern.startswith("^") and pattern.endswith("$")):
            del schema["pattern"]
        limit = schema.get("maxLength")
        limit = ARGUMENT_STRING_CHARS if not isinstance(limit, int) else limit
        schema["maxLength"] = min(limit, ARGUMENT_STRING_CHARS)
        if isinstance(schema.get("minLength"), int):
            schema["minLength"] = min(schema["minLength"], schema["maxLength"])
    for value in schema.values():
        if isinstance(value, dict | list):
            _bounded(value)
