"""A tool's schema may come from outside (an MCP server): it is checked once, at construction,
and never makes the worker fetch anything, nor crash the check of a call's arguments."""

from __future__ import annotations

from typing import Any

import pytest

from planner import ToolContext, ToolRegistryError, ToolSpec


async def _noop(args: dict[str, Any], ctx: ToolContext) -> None:
    return None


def _spec(schema: dict[str, Any]) -> ToolSpec:
    return ToolSpec("t", "a tool", schema, "read", _noop)


@pytest.mark.parametrize(
    "ref",
    [
        "http://127.0.0.1:9/schema.json",  # would be an SSRF from the worker's network
        "https://example.com/item.json#/x",
        "file:///etc/passwd",
        "item.json",  # relative to a base URI: not inside this schema either
    ],
)
@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef"])
def test_a_reference_outside_the_schema_is_refused_at_construction(keyword: str, ref: str) -> None:
    schema = {"type": "object", "properties": {"a": {"prefixItems": [{keyword: ref}]}}}
    with pytest.raises(ToolRegistryError, match="only references into the schema itself"):
        _spec(schema)


def test_local_references_work() -> None:
    spec = _spec(
        {
            "type": "object",
            "$defs": {"n": {"type": "integer"}},
            "properties": {"a": {"$ref": "#/$defs/n"}, "$ref": {"type": "string"}},
        }
    )
    assert spec.validate_arguments({"a": 1, "$ref": "a property named $ref"}) is None
    assert "is not of type 'integer'" in (spec.validate_arguments({"a": "x"}) or "")


def test_a_local_reference_to_nowhere_is_a_readable_error_not_a_crash() -> None:
    spec = _spec({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    problem = spec.validate_arguments({"a": 1})
    assert problem is not None and problem.startswith("the schema of t cannot be checked")


def test_a_schema_nested_too_deeply_is_refused_at_construction() -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(5_000):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(ToolRegistryError, match="nested too deeply"):
        _spec(schema)


async def test_with_handler_swaps_the_handler_and_keeps_the_checked_tool() -> None:
    spec = _spec({"type": "object", "properties": {"n": {"type": "integer"}}})
    assert spec.validate_arguments({"n": "x"}) is not None  # compiles the validators

    async def wrapped(args: dict[str, Any], ctx: ToolContext) -> str:
        return "wrapped"

    bound = spec.with_handler(wrapped)
    assert await bound.handler({}, ToolContext(user_id="u")) == "wrapped"
    assert await spec.handler({}, ToolContext(user_id="u")) is None  # the original stays
    assert (bound.name, bound.input_schema, bound.policy_hint) == ("t", spec.input_schema, "read")
    assert bound.validate_arguments({"n": 1}) is None
    assert bound.validate_arguments({"n": "x"}) == spec.validate_arguments({"n": "x"})
    assert bound._fast_validator is spec._fast_validator  # compiled once, not per run
