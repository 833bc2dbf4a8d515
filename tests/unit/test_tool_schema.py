"""Tool parameter schemas sent per dialect, minus the keywords an operator strips."""

from __future__ import annotations

from typing import Any

import pytest

from worker.llm.tool_schema import adapt_schema

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "examples": ["time"]},
        # a property *named* like a keyword is a name, not a keyword
        "default": {"type": "string", "default": "x"},
        "tags": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": False, "properties": {}},
        },
        "when": {"anyOf": [{"type": "string", "const": "now"}, {"type": "integer"}]},
    },
    "required": ["title"],
    "additionalProperties": False,
}


def test_json_schema_sends_the_schema_as_written() -> None:
    assert adapt_schema(SCHEMA) == SCHEMA
    assert adapt_schema(SCHEMA) is not SCHEMA


def test_gemini_keeps_only_the_keywords_of_its_schema_object() -> None:
    assert adapt_schema(SCHEMA, dialect="gemini") == {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1},
            "default": {"type": "string", "default": "x"},
            "tags": {"type": "array", "items": {"type": "object", "properties": {}}},
            "when": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        },
        "required": ["title"],
    }


def test_an_operator_strips_named_keywords_everywhere_a_schema_can_be() -> None:
    stripped = adapt_schema(SCHEMA, strip={"additionalProperties", "default"})
    assert "additionalProperties" not in stripped
    assert "additionalProperties" not in stripped["properties"]["tags"]["items"]
    assert stripped["properties"]["default"] == {"type": "string"}  # the property stays
    assert stripped["properties"]["title"]["examples"] == ["time"]


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schema dialect 'openapi'"):
        adapt_schema(SCHEMA, dialect="openapi")  # type: ignore[arg-type]
