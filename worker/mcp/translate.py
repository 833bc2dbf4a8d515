"""MCP tools and results in the planner's terms: a listed ``mcp.types.Tool`` as a
``ToolSpec``, and a ``CallToolResult`` as what the agent reads.

A tool becomes:

* name ``SERVER__tool`` (``worker.mcp.config.namespaced_tool_name``), scope ``mcp:SERVER``;
* policy hint from its annotations: ``destructiveHint`` → ``destructive``, ``readOnlyHint`` →
  ``read``, else ``write`` — so the policy gate, parallel reads and the audit apply as to
  built-ins (annotations are the server's word: give agents servers you trust);
* its JSON schema as is, when ``ToolSpec`` accepts it (an object schema, references only into
  itself, at most ``MAX_SCHEMA_CHARS`` characters); its description cut at
  ``MAX_DESCRIPTION_CHARS``. A tool without a name or with a schema that cannot be used is left
  out, with the reason.

A result is its structured content when there is some, else the text of its content blocks
(other blocks described in a line), cut to the configured number of characters with a note
saying so; a result the server marks as an error raises ``McpToolError`` (the loop turns it
into the call's error result).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

from planner import ToolSpec
from planner.errors import ToolRegistryError
from planner.tools import ToolHandler
from worker.mcp.config import (
    McpServerConfig,
    mcp_scope,
    namespaced_tool_name,
    policy_hint_from_annotations,
)

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_SCHEMA_CHARS",
    "McpToolError",
    "result_value",
    "schema_problem",
    "tool_spec",
]

MAX_SCHEMA_CHARS = 100_000
"""Characters of one tool's JSON schema at most (it is sent with every request)."""
MAX_DESCRIPTION_CHARS = 4_000
"""A longer description is cut (it is sent with every request)."""


class McpToolError(Exception):
    """An MCP tool answered with an error (``isError``), or could not be called; the message
    says what the server said (never a secret)."""


def tool_spec(
    server: McpServerConfig,
    tool: Any,
    taken: Collection[str],
    handler_for: Callable[[str], ToolHandler],
) -> tuple[ToolSpec | None, str | None]:
    """``(spec, None)`` for MCP ``tool`` of ``server`` (a name not in ``taken``; its handler
    from ``handler_for(original name)``), or ``(None, why it was left out)``."""
    original = tool.name if isinstance(tool.name, str) else ""
    shown = repr(original[:80])
    if not original.strip():
        return None, "a tool without a name was left out"
    name = namespaced_tool_name(server.name, original, taken)
    if name in taken:
        return None, f"tool {shown} was left out: its name {name} is taken"
    schema = tool.input_schema
    problem = schema_problem(schema)
    if problem is not None:
        return None, f"tool {shown} was left out: its input schema {problem}"
    description = (tool.description or tool.title or "").strip()
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS] + " …"
    try:
        spec = ToolSpec(
            name=name,
            description=description or f"{original} (MCP server {server.name})",
            input_schema=schema,
            policy_hint=policy_hint_from_annotations(tool.annotations),
            scope=mcp_scope(server.name),
            handler=handler_for(original),
        )
    except ToolRegistryError as exc:
        return None, f"tool {shown} was left out: {exc}"
    return spec, None


def schema_problem(schema: Any) -> str | None:
    """Why an MCP tool's input schema cannot be used as is, or ``None``."""
    if not isinstance(schema, dict):
        return "is not a JSON object"
    if schema.get("type") != "object":
        return "is not an object schema (type: object)"
    try:
        size = len(json.dumps(schema))
    except (ValueError, TypeError, RecursionError):
        return "cannot be encoded as JSON"
    if size > MAX_SCHEMA_CHARS:
        return f"has {size} characters, more than {MAX_SCHEMA_CHARS}"
    return None


def result_value(result: Any, max_chars: int) -> Any:
    """What the agent gets from an MCP ``CallToolResult`` (see the module docstring).

    Raises:
        McpToolError: the result is marked as an error.
    """
    text = "\n".join(_block_text(block) for block in result.content or ())
    if result.is_error:
        raise McpToolError(_cut(text, max_chars) or "the tool failed without saying why")
    structured = result.structured_content
    if structured is not None:
        try:
            encoded = json.dumps(structured, ensure_ascii=False)
        except (ValueError, TypeError, RecursionError):
            return _cut(text, max_chars)
        return _cut(encoded, max_chars) if len(encoded) > max_chars else structured
    return _cut(text, max_chars)


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return (
        f"{text[:max_chars]}\n[cut: the result has {len(text)} characters; the first "
        f"{max_chars} are shown (MANA_AI_MCP_MAX_RESULT_CHARS)]"
    )


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {len(block.data)} base64 characters, not shown]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    if kind == "resource":
        inner = block.resource
        text = getattr(inner, "text", None)
        return text if isinstance(text, str) else f"[resource {inner.uri}, binary, not shown]"
    return f"[{kind or 'unknown'} content, not shown]"
