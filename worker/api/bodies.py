"""The HTTP API's request bodies: their shapes (pydantic models: the JSON types, no unknown
field), read within the size limit, then checked by the same rules as the command line
(``worker.admin``: names, texts, ranges, schedules), with the same messages naming the JSON
field instead of the flag.

``read_body`` answers 400 for malformed JSON, a body that is not an object, an unknown field
or a value of the wrong type, naming the field (``max_rounds: Input should be a valid
integer``); ``parsed`` runs a command-line value rule (``worker.admin.values``) on a JSON value.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
)
from starlette.requests import Request

from worker.admin.agents import DEFAULT_SYSTEM_PROMPT
from worker.admin.deciding import MAX_NOTE_CHARS
from worker.admin.values import INT32_MAX, MAX_ROUNDS
from worker.api import schema_rules as rules
from worker.errors import UsageError
from worker.settings.values import MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS

__all__ = [
    "AgentBody",
    "AgentChangesBody",
    "ApproveBody",
    "DecisionBody",
    "DenyBody",
    "MissionBody",
    "RerunBody",
    "field_label",
    "parsed",
    "read_body",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def field_label(name: str) -> str:
    """How the API names a field in a message: as it is (``max_rounds``)."""
    return name


def _whole_number(value: Any) -> Any:
    """``5.0`` as ``5``: JSON has one number type, and JSON Schema's ``integer`` takes a
    number with no fraction; ``5.5``, strings and booleans stay as given (and are refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[StrictInt, BeforeValidator(_whole_number)]
"""An integer field of a body: an integer, or a number with no fraction (``5.0``)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


_MODES = ("off", "log-only", "enforce")
_DESTRUCTIVE = ("deny", "ask")
_CONTEXT = {
    "anyOf": [
        {"type": "integer", "const": 0},
        {"type": "integer", "minimum": MIN_CONTEXT_TOKENS, "maximum": MAX_CONTEXT_TOKENS},
        {"type": "null"},
    ]
}
"""A model's context for compaction: 0 (never) or 256-100000000 tokens, or null."""


def _tools(schema: dict[str, Any]) -> None:
    """A list of built-in tools, at least one (``worker.admin.agents.tool_list``)."""
    from worker.tools import builtin_tool_catalog

    names = sorted(t.name for t in builtin_tool_catalog())
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "array":
            option.update(minItems=1, items={"type": "string", "enum": names})


def _context(schema: dict[str, Any]) -> None:
    schema.pop("anyOf", None)
    schema.pop("type", None)
    schema.update(_CONTEXT)


class AgentBody(_Body):
    """A new agent (``POST /api/v1/agents``): the fields of ``mana-ai agents add``."""

    name: str = Field(
        description="unique agent name (the names rule: 1-200 characters)",
        json_schema_extra=rules.name,
    )
    owner: str = Field(
        description="owner user id; tools act in their space", json_schema_extra=rules.name
    )
    system_prompt: str = Field(
        default=DEFAULT_SYSTEM_PROMPT,
        description="agent instructions",
        json_schema_extra=rules.text(),
    )
    model: str | None = Field(
        default=None, description="model name (null: the default)", json_schema_extra=rules.name
    )
    max_rounds: WholeInt = Field(
        default=5,
        description="rounds per run, 1-1000",
        json_schema_extra=rules.integer(1, MAX_ROUNDS),
    )
    max_tokens_per_day: WholeInt | None = Field(
        default=None,
        description="daily token budget, 1-2147483647 (null: none)",
        json_schema_extra=rules.integer(1, INT32_MAX),
    )
    tools: list[str] | None = Field(
        default=None,
        description="built-in tools it may call (null: every built-in tool but web_fetch)",
        json_schema_extra=_tools,
    )
    policy_mode: str | None = Field(
        default=None,
        description="off | log-only | enforce (null: MANA_AI_POLICY_MODE)",
        json_schema_extra=rules.choice(*_MODES),
    )
    destructive: str | None = Field(
        default=None,
        description="deny | ask (null: MANA_AI_POLICY_DESTRUCTIVE)",
        json_schema_extra=rules.choice(*_DESTRUCTIVE),
    )
    compact_max_ctx: WholeInt | None = Field(
        default=None,
        description="its model's context for compaction: 0 (never) or 256-100000000 "
        "(null: MANA_AI_COMPACT_MAX_CTX)",
        json_schema_extra=_context,
    )


class AgentChangesBody(_Body):
    """Changes to an agent (``PATCH /api/v1/agents/{name}``): only the fields given change,
    at least one; ``null`` (or ``"default"`` for model, policy_mode, destructive) puts a field
    back to its default (the daemon's model, mode, context; no budget; every built-in tool).
    ``system_prompt`` and ``max_rounds`` have no default to go back to."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    system_prompt: str = Field(default="", json_schema_extra=rules.text())
    model: str | None = Field(default=None, json_schema_extra=rules.name)
    max_rounds: WholeInt = Field(default=5, json_schema_extra=rules.integer(1, MAX_ROUNDS))
    max_tokens_per_day: WholeInt | None = Field(
        default=None, json_schema_extra=rules.integer(1, INT32_MAX)
    )
    tools: list[str] | None = Field(default=None, json_schema_extra=_tools)
    policy_mode: str | None = Field(
        default=None, json_schema_extra=rules.choice(*_MODES, "default")
    )
    destructive: str | None = Field(
        default=None, json_schema_extra=rules.choice(*_DESTRUCTIVE, "default")
    )
    compact_max_ctx: WholeInt | None = Field(default=None, json_schema_extra=_context)


def _one_schedule(schema: dict[str, Any]) -> None:
    """A mission's rules across fields (``worker.admin.missions``): cron, at or due_now;
    at not with cron nor due_now; timezone only with cron; catch_up all only with cron;
    catch_up_window only with catch_up all."""
    given = _given
    schema["allOf"] = [
        {"anyOf": [given("cron"), given("at"), {"required": ["due_now"], "properties": {
            "due_now": {"const": True}}}]},
        {"not": {"allOf": [given("cron"), given("at")]}},
        {"not": {"allOf": [given("at"), {"required": ["due_now"], "properties": {
            "due_now": {"const": True}}}]}},
        {"if": given("timezone"), "then": given("cron")},
        {"if": {"required": ["catch_up"], "properties": {"catch_up": {"const": "all"}}},
         "then": given("cron")},
        {"if": given("catch_up_window"), "then": {
            "required": ["catch_up"], "properties": {"catch_up": {"const": "all"}}}},
    ]  # fmt: skip


def _given(field: str) -> dict[str, Any]:
    """A schema for: ``field`` is given, and not null."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


class MissionBody(_Body):
    """A new mission (``POST /api/v1/missions``): the fields of ``mana-ai missions add``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_schedule)

    agent: str = Field(description="the agent's name", json_schema_extra=rules.name)
    objective: str = Field(
        description="what the agent should do each run (up to 20,000 chars)",
        json_schema_extra=rules.text(),
    )
    cron: str | None = Field(
        default=None, description="5-field cron: a recurring mission", json_schema_extra=rules.cron
    )
    timezone: str | None = Field(
        default=None,
        description="IANA timezone of the cron (null: UTC); only with cron",
        json_schema_extra=rules.timezone,
    )
    at: str | None = Field(
        default=None,
        description="one-shot run time, ISO 8601 with a UTC offset, in the future",
        json_schema_extra={"pattern": rules.ISO_TIME},
    )
    due_now: StrictBool = Field(default=False, description="first run now")
    deadline: str | None = Field(
        default=None,
        description="no runs after this time (ISO 8601 with a UTC offset)",
        json_schema_extra={"pattern": rules.ISO_TIME},
    )
    catch_up: Literal["skip", "once", "all"] = Field(
        default="once",
        description="runs missed while no worker could start them: skip them, run once for "
        "all of them, or run each one within catch_up_window while the budget has room",
    )
    catch_up_window: str | None = Field(
        default=None,
        description="with catch_up all: how far back missed runs still run, e.g. 6h, 2d "
        "(1m to 30d; null: 1d)",
        json_schema_extra={"pattern": rules.DURATION},
    )


class DecisionBody(_Body):
    """A decision on an approval request, and why, as the server reads it (a ``reason`` on
    an approval or a ``note`` on a denial is refused, naming the right field). Who decides is
    the token's name, never a field of the body (a token cannot decide in another's name).
    Documented as ``ApproveBody`` and ``DenyBody``."""

    note: str | None = Field(default=None, description="approve: a note kept with it")
    reason: str | None = Field(default=None, description="deny: why (the model reads it)")


class ApproveBody(_Body):
    """An approval (``POST /api/v1/approvals/{id}/approve``), with a note kept with it."""

    note: str | None = Field(
        default=None,
        description="a note kept with the approval (up to 2,000 characters)",
        json_schema_extra=rules.text(MAX_NOTE_CHARS),
    )


class DenyBody(_Body):
    """A denial (``POST /api/v1/approvals/{id}/deny``), with why: the model reads it."""

    reason: str | None = Field(
        default=None,
        description="why (the model reads it; up to 2,000 characters)",
        json_schema_extra=rules.text(MAX_NOTE_CHARS),
    )


class RerunBody(_Body):
    """A rerun of an iteration under today's rules."""

    policy_mode: str | None = Field(
        default=None,
        description="off | log-only | enforce instead of today's mode",
        json_schema_extra=rules.choice(*_MODES),
    )


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as ``model`` (an empty body reads as ``{}``).

    Raises:
        UsageError: malformed JSON (a key twice, a number of more than 4300 digits, arrays or
            objects nested past Python's recursion limit included), not an object, an unknown
            field, or a value of the wrong type (the message names the field and the position
            in the JSON).
    """
    raw = await request.body()
    try:
        data: Any = json.loads(raw, object_pairs_hook=_unique_keys) if raw.strip() else {}
    except RecursionError:
        raise UsageError("the body is not JSON this server reads: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int past its limit
        raise UsageError(f"the body is not JSON this server reads: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"the body must be a JSON object, not {_json_kind(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the body"
        message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise UsageError(f"{where}: {message}{more}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys differ (``json.loads``' ``object_pairs_hook``): a key given
    twice is refused rather than the last one silently winning."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"the key {key!r} is given twice")
        data[key] = value
    return data


def parsed(value: Any, rule: Callable[[str], T], field: str) -> T:
    """``value`` checked by a command-line value rule (``worker.admin.values``), its message
    naming ``field``.

    Raises:
        UsageError: the rule refused it.
    """
    try:
        return rule(str(value))
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{field}: {exc}") from None


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words: ``null``, ``an array``, ``a string``, …"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "a string"
