"""An MCP server's tools and results in the planner's terms (no server: the SDK's types)."""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pytest

from planner import ToolContext
from worker.mcp.translate import McpToolError, result_value, tool_spec
from worker.store.agent_servers import McpServerConfig

SERVER = McpServerConfig(name="fs", transport="stdio", command="srv")


def _handler(name: str, hint: str) -> Any:
    async def call(arguments: dict[str, Any], ctx: ToolContext) -> str:
        return name

    return call


def test_a_tool_becomes_a_namespaced_spec_in_its_servers_scope() -> None:
    tool = types.Tool(
        name="delete file",
        description="Delete.",
        input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
        annotations=types.ToolAnnotations(destructive_hint=True),
    )
    spec, problem = tool_spec(SERVER, tool, {"notes_list"}, _handler)
    assert problem is None and spec is not None
    assert (spec.name, spec.scope, spec.policy_hint) == ("fs__delete_file", "mcp:fs", "destructive")
    assert spec.input_schema == tool.input_schema and spec.description == "Delete."


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"$ref": "https://x/s.json"}}}, "not local"),
        ({"type": "object", "properties": {"a": {"type": 7}}}, "invalid JSON schema"),
        ({"type": "object", "description": "x" * 200_000}, "more than 100000"),
        ({"properties": {}}, "is not an object schema"),
        ({"type": "nonsense"}, "is not an object schema"),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
            "has a reference '#/$defs/missing' to nothing in it",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#nowhere"}}}, "to nothing in it"),
    ],
)
def test_a_tool_whose_schema_cannot_be_used_is_left_out_with_the_reason(
    schema: dict[str, Any], problem: str
) -> None:
    tool = types.Tool.model_construct(name="t", input_schema=schema, annotations=None)
    spec, why = tool_spec(SERVER, tool, set(), _handler)
    assert spec is None and why is not None and problem in why


def test_local_references_that_resolve_are_fine() -> None:
    schema = {
        "type": "object",
        "$defs": {"p": {"$anchor": "point", "type": "number"}},
        "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#point"}, "c": {"$ref": "#"}},
    }
    tool = types.Tool(name="t", input_schema=schema)
    spec, why = tool_spec(SERVER, tool, set(), _handler)
    assert why is None and spec is not None


@pytest.mark.parametrize(
    ("name", "description", "listed", "problem"),
    [
        ("echo", "", {"echo"}, "tool 'echo' was left out: the server lists a tool of that name"),
        ("a" * 129, "", set(), "its name has 129 characters, more than 128"),
        ("tab\tname", "", set(), "its name holds control characters or is not valid Unicode"),
        ("lone\ud800", "", set(), "its name holds control characters or is not valid Unicode"),
        ("t", "d" * 100_001, set(), "its description has 100001 characters, more than 100000"),
    ],
)
def test_junk_in_one_tool_leaves_that_tool_out_with_the_reason(
    name: str, description: str, listed: set[str], problem: str
) -> None:
    tool = types.Tool(name=name, description=description, input_schema={"type": "object"})
    spec, why = tool_spec(SERVER, tool, set(), _handler, listed=listed)
    assert spec is None and why is not None and problem in why


def test_names_and_descriptions_at_their_limits_are_kept() -> None:
    tool = types.Tool(name="a" * 128, description="d" * 100_000, input_schema={"type": "object"})
    spec, why = tool_spec(SERVER, tool, set(), _handler, listed={"b"})
    assert why is None and spec is not None
    assert len(spec.description) == 4_002  # cut at MAX_DESCRIPTION_CHARS, as before


def test_results_in_the_agents_terms() -> None:
    text = types.CallToolResult(content=[types.TextContent(text="a"), types.TextContent(text="b")])
    assert result_value(text, 100) == "a\nb"
    structured = types.CallToolResult(content=[], structured_content={"n": 1})
    assert result_value(structured, 100) == {"n": 1}
    image = types.CallToolResult(content=[types.ImageContent(data="AAAA", mime_type="image/png")])
    assert result_value(image, 100) == "[image image/png, 4 base64 characters, not shown]"
    big = types.CallToolResult(content=[], structured_content={"s": "x" * 500})
    cut = result_value(big, 100)
    assert isinstance(cut, str) and cut.startswith('{"s": "xxx')
    assert "[cut: the result has 509 characters; the first 100 are shown" in cut
    with pytest.raises(McpToolError, match=r"^no such file$"):
        result_value(
            types.CallToolResult(content=[types.TextContent(text="no such file")], is_error=True),
            100,
        )
