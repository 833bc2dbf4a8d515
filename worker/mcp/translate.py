"""MCP tools and results in the planner's terms: a listed ``mcp.types.Tool`` as a
``ToolSpec``, and a ``CallToolResult`` as what the agent reads.

A tool becomes:

* name ``SERVER__tool`` (``worker.mcp.config.namespaced_tool_name``), scope ``mcp:SERVER``;
* policy hint from its annotations: ``destructiveHint`` → ``destructive``, ``readOnlyHint`` →
  ``read``, else ``write`` — so the policy gate, parallel reads and the audit apply as to
  built-ins (annotations are the server's word: give agents servers you trust);
* its JSON schema as is, when ``ToolSpec`` accepts it (an object schema, references only into
  itself and each of them found there, at most ``MAX_SCHEMA_CHARS`` characters); its
  description cut at ``MAX_DESCRIPTION_CHARS``.

Each tool is judged alone: one that cannot be used is left out with the reason, and the
server's other tools stay. Left out are a tool without a name, with a name that is no MCP tool
name (longer than ``MAX_LISTED_NAME_CHARS``, the specification's limit, or holding control
characters; other odd characters are only replaced, see ``worker.mcp.config``), with the name
of a tool listed before it, with a description longer than ``MAX_LISTED_DESCRIPTION_CHARS``
(junk, not a description), or with a schema that cannot be used. (A tool whose entry breaks
the MCP specification never gets here: ``worker.mcp.guard`` takes it out of the listing.)

A result is its structured content when there is some, else the text of its content blocks
(other blocks described in a line), cut to the configured number of characters with a note
saying so; a result cut while it was read (``worker.mcp.wire``) is the text its first bytes
held, with a note saying that. A result the server marks as an error raises
``McpToolError`` (the loop turns it into the call's error result).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import Any

from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from planner import ToolSpec
from planner.errors import ToolError, ToolRegistryError
from planner.tools import PolicyHint, ToolHandler
from worker.mcp.config import mcp_scope, namespaced_tool_name, policy_hint_from_annotations
from worker.mcp.wire import CUT_META_KEY, RESULT_BYTES_PER_CHAR, RESULT_HEADROOM_BYTES
from worker.store.agent_servers import McpServerConfig

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_LISTED_DESCRIPTION_CHARS",
    "MAX_LISTED_NAME_CHARS",
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
MAX_LISTED_DESCRIPTION_CHARS = 100_000
"""A tool with a longer description is left out (no server describes a tool in a book)."""
MAX_LISTED_NAME_CHARS = 128
"""A tool with a longer name is left out (the MCP specification's limit, SEP-986)."""

_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_BASE = "urn:mana-ai:tool-schema"


class McpToolError(ToolError):
    """An MCP tool answered with an error (``isError``), or could not be called; the message
    says what the server said (never a secret)."""


def tool_spec(
    server: McpServerConfig,
    tool: Any,
    taken: Collection[str],
    handler_for: Callable[[str, PolicyHint], ToolHandler],
    *,
    listed: Collection[str] = (),
) -> tuple[ToolSpec | None, str | None]:
    """``(spec, None)`` for MCP ``tool`` of ``server`` (a name not in ``taken``; its handler
    from ``handler_for(original name, policy hint)``), or ``(None, why it was left out)``.
    ``listed`` are the original names of the server's tools taken before this one."""
    original = tool.name if isinstance(tool.name, str) else ""
    shown = repr(original[:80])
    if not original.strip():
        return None, "a tool without a name was left out"
    problem = _name_problem(original, listed)
    if problem is not None:
        return None, f"tool {shown} was left out: {problem}"
    name = namespaced_tool_name(server.name, original, taken)
    if name in taken:
        return None, f"tool {shown} was left out: its name {name} is taken"
    schema = tool.input_schema
    problem = schema_problem(schema)
    if problem is not None:
        return None, f"tool {shown} was left out: its input schema {problem}"
    description = (tool.description or tool.title or "").strip()
    if len(description) > MAX_LISTED_DESCRIPTION_CHARS:
        return None, (
            f"tool {shown} was left out: its description has {len(description)} characters, "
            f"more than {MAX_LISTED_DESCRIPTION_CHARS}"
        )
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS] + " …"
    hint = policy_hint_from_annotations(tool.annotations)
    try:
        spec = ToolSpec(
            name=name,
            description=description or f"{original} (MCP server {server.name})",
            input_schema=schema,
            policy_hint=hint,
            scope=mcp_scope(server.name),
            handler=handler_for(original, hint),
            # MCP's idempotentHint: repeating a call has no further effect, so a call in
            # flight when its run stopped may run again (the key goes in its _meta)
            idempotent=getattr(tool.annotations, "idempotent_hint", None) is True,
        )
    except ToolRegistryError as exc:
        return None, f"tool {shown} was left out: {exc}"
    return spec, None


def _name_problem(original: str, listed: Collection[str]) -> str | None:
    """Why ``original`` cannot name a tool of this server, or ``None``."""
    if len(original) > MAX_LISTED_NAME_CHARS:
        return (
            f"its name has {len(original)} characters, more than {MAX_LISTED_NAME_CHARS} (the "
            "MCP specification's limit)"
        )
    if _CONTROL.search(original):
        return "its name holds control characters or is not valid Unicode"
    if original in listed:
        return "the server lists a tool of that name before it"
    return None


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
    missing = _unresolved_reference(schema)
    if missing is not None:
        return f"has a reference {missing[:200]!r} to nothing in it"
    return None


def _unresolved_reference(schema: dict[str, Any]) -> str | None:
    """The first local ``$ref`` (``#...``) of ``schema`` that points to nothing in it, or
    ``None`` (also when a nested ``$id`` moves references elsewhere: the check of each call
    judges those). Iterative, so any depth is fine."""
    refs: list[str] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node is not schema and "$id" in node:
                return None
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.append(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    if not refs:
        return None
    try:
        resource = DRAFT202012.create_resource(schema)
        resolver = Registry().with_resource(_BASE, resource).resolver(_BASE)
    except Exception:  # a schema referencing cannot index: ToolSpec judges it
        return None
    for ref in refs:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            return ref
        except Exception:  # a reference it cannot read: ToolSpec's check has the last word
            continue
    return None


def result_value(result: Any, max_chars: int) -> Any:
    """What the agent gets from an MCP ``CallToolResult`` (see the module docstring).

    Raises:
        McpToolError: the result is marked as an error.
    """
    text = "\n".join(_block_text(block) for block in result.content or ())
    cut = (result.meta or {}).get(CUT_META_KEY)
    if isinstance(cut, dict):
        shown = text[:max_chars]
        note = (
            f"\n[cut while it was read: the reply had more than {cut.get('limit_bytes')} bytes "
            f"({RESULT_BYTES_PER_CHAR} per character of MANA_AI_MCP_MAX_RESULT_CHARS + "
            f"{RESULT_HEADROOM_BYTES // 1024} KiB); the first {len(shown)} characters are shown]"
        )
        if cut.get("is_error") is True:
            raise McpToolError(shown + note)
        return shown + note
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
