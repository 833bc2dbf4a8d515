"""The JSON Schemas of what the API answers (``worker.api.openapi``), made from the tables the
rows come from (``worker.db.tables``: a column's SQL type and nullability give its JSON type)
and the fields each endpoint adds, so that a column added to a table is documented with it.

Times are ISO 8601 text with their offset, durations ISO 8601 durations (``PT6H``: pydantic's
writing of a ``timedelta``), JSON columns any JSON. Every object may carry fields added after
this document (``additionalProperties`` is not closed), never fewer than it lists.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, Integer, Interval, Numeric
from sqlalchemy import Table as SqlTable
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from worker.db.tables import (
    agents,
    approval_requests,
    compacted_turns,
    mcp_tokens,
    mission_iterations,
    missions,
    tool_invocations,
)

__all__ = ["RESPONSE_SCHEMAS", "response_ref"]

Schema = dict[str, Any]


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_TIME: Schema = {"type": "string", "format": "date-time"}
_TEXT: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}


def _column_schema(column: Any) -> Schema:
    """One column's JSON Schema, by its SQL type."""
    kind = column.type
    schema: Schema
    if isinstance(kind, Boolean):
        schema = {"type": "boolean"}
    elif isinstance(kind, Integer | BigInteger):
        schema = {"type": "integer"}
    elif isinstance(kind, Float | Numeric):
        schema = {"type": "number"}
    elif isinstance(kind, DateTime):
        schema = dict(_TIME)
    elif isinstance(kind, Interval):
        schema = {"type": "string", "format": "duration"}
    elif isinstance(kind, JSONB | JSON):
        schema = {}
    elif isinstance(kind, ARRAY):
        schema = {"type": "array"}
    else:
        schema = {"type": "string"}
    return _nullable(schema) if column.nullable and schema else schema


def _row(
    table: SqlTable,
    *,
    without: tuple[str, ...] = (),
    extra: dict[str, Schema] | None = None,
    optional: dict[str, Schema] | None = None,
) -> Schema:
    """A row of ``table`` (its columns but ``without``), with ``extra`` fields always sent and
    ``optional`` ones sent by some endpoints only."""
    properties = {c.name: _column_schema(c) for c in table.c if c.name not in without}
    properties |= extra or {}
    return {
        "type": "object",
        "required": sorted(set(properties)),
        "properties": properties | (optional or {}),
    }


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _list(key: str, item: str, *, paged: bool = False) -> Schema:
    properties: Schema = {key: {"type": "array", "items": _ref(item)}}
    if paged:
        properties["next"] = {
            "anyOf": [_INT, {"type": "null"}],
            "description": "the 'before' of the next page; null at the end",
        }
    return {"type": "object", "required": sorted(properties), "properties": properties}


_COUNTS: Schema = {"type": "object", "additionalProperties": {"type": "integer"}}

RESPONSE_SCHEMAS: dict[str, Schema] = {
    "Agent": _row(
        agents,
        optional={"mcp_servers": {"type": "array", "items": {"type": "object"}}},
    ),
    "Mission": _row(
        missions,
        optional={
            "agent": {**_TEXT, "description": "the agent's name (not in a course's answer)"},
            "iterations": _INT,
            "awaiting_approval": _nullable(_INT),
            "next_run_local": {
                **_nullable(_TIME),
                "description": "the next run in the schedule's time zone (null in UTC)",
            },
            "last_iteration_id": _nullable(_INT),
            "last_status": _nullable(_TEXT),
            "last_stop_reason": _nullable(_TEXT),
            "last_started_at": _nullable(_TIME),
            "last_warning": {
                **_nullable(_TEXT),
                "description": "the verdict's warning on the last run (an answer stating "
                "figures no tool returned), else null",
            },
        },
    ),
    "Course": {
        "type": "object",
        "required": ["mission", "changed", "note"],
        "properties": {
            "mission": _ref("Mission"),
            "changed": {"type": "boolean"},
            "note": _nullable(_TEXT),
        },
    },
    "IterationRow": _row(
        mission_iterations,
        without=("messages",),
        extra={
            "warning": {
                **_nullable(_TEXT),
                "description": "the verdict's warning (an answer stating figures no tool "
                "returned), else null",
            }
        },
    ),
    "ToolInvocation": _row(tool_invocations),
    "Compaction": _row(compacted_turns),
    "Approval": _row(
        approval_requests,
        extra={
            "agent": _nullable(_TEXT),
            "iteration_status": _nullable(_TEXT),
            "mission_status": _nullable(_TEXT),
            "call_outcome": _nullable(_TEXT),
            "call_reason": _nullable(_TEXT),
            "arguments_intact": {"type": "boolean"},
            "objective": {**_nullable(_TEXT), "description": "the mission's objective"},
        },
    ),
    "IterationApproval": _row(approval_requests),
    "Iteration": _row(
        mission_iterations,
        optional={
            "verdict": {
                **_TEXT,
                "description": "one line on what the tools did and whether "
                "the answer's figures came from somewhere (as iterations show ends)",
            },
            "warning": _nullable(_TEXT),
        },
        extra={
            "tool_invocations": {"type": "array", "items": _ref("ToolInvocation")},
            "compactions": {"type": "array", "items": _ref("Compaction")},
            "approvals": {"type": "array", "items": _ref("IterationApproval")},
        },
    ),
    "Replay": {
        "type": "object",
        "required": ["iteration", "events"],
        "properties": {
            "iteration": {"type": "object", "required": ["id", "mission_id", "status"]},
            "events": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["event"],
                    "properties": {"event": _TEXT},
                },
            },
        },
    },
    "Rerun": {
        "type": "object",
        "required": [
            "iteration_id",
            "settings",
            "differences",
            "compared",
            "not_compared",
            "notes",
        ],
        "properties": {
            "iteration_id": _INT,
            "settings": {"type": "object"},
            "differences": {"type": "array"},
            "compared": _COUNTS,
            "not_compared": {"type": "array"},
            "notes": {"type": "array"},
        },
    },
    "PolicyReport": {
        "type": "object",
        "required": [
            "since",
            "calls",
            "decided",
            "by_mode",
            "by_reason",
            "by_tool",
            "injection_flags",
            "by_consumer",
            "would_deny_share",
            "approvals",
        ],
        "properties": {
            "since": _TIME,
            "calls": _INT,
            "decided": _INT,
            "by_mode": {"type": "object", "additionalProperties": _COUNTS},
            "by_reason": {"type": "array", "items": {"type": "object"}},
            "by_tool": {"type": "array", "items": {"type": "object"}},
            "injection_flags": _COUNTS,
            "by_consumer": {"type": "array", "items": {"type": "object"}},
            "would_deny_share": _nullable({"type": "number"}),
            "approvals": _COUNTS,
        },
    },
    "McpToken": _row(mcp_tokens, without=("token_hash",)),
    "McpTokenRevoked": {
        "type": "object",
        "required": ["token", "changed"],
        "properties": {"token": _ref("McpToken"), "changed": {"type": "boolean"}},
    },
    "Agents": _list("agents", "Agent"),
    "Missions": _list("missions", "Mission", paged=True),
    "Iterations": _list("iterations", "IterationRow", paged=True),
    "Approvals": _list("approvals", "Approval", paged=True),
    "McpTokens": _list("tokens", "McpToken"),
}
"""Every answer's schema, by name (``components/schemas`` of the document)."""


def response_ref(name: str) -> Schema:
    """A reference to ``RESPONSE_SCHEMAS[name]`` in the document. Raises KeyError for a
    name it does not have."""
    if name not in RESPONSE_SCHEMAS:  # a name the table does not have is a bug: say so now
        raise KeyError(name)
    return _ref(name)
