"""Tools the model may call: ToolSpec, ToolContext, ToolRegistry.

A ToolSpec carries everything the loop and the policy gate need to know about a tool: its
name, description and JSON schema (sent to the model), its ``policy_hint`` (``read`` tools may
run in parallel; ``destructive`` ones need an explicit opt-in), its ``scope``, its handler and
an optional per-call timeout.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import jsonschema
import jsonschema_rs
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from planner.errors import ToolRegistryError
from planner.llm import OpenAIFunction

if TYPE_CHECKING:
    from planner.approvals import Approval

__all__ = [
    "EffectHandler",
    "OutcomeLookup",
    "PolicyHint",
    "ToolContext",
    "ToolHandler",
    "ToolRegistry",
    "ToolSpec",
]

PolicyHint = Literal["read", "write", "destructive"]


@dataclass(frozen=True)
class ToolContext:
    """Who a tool call runs for. Handlers read it; they never get it from the model.

    Attributes:
        user_id: the agent owner's user id (tools act in this user's space).
        agent_id, mission_id, iteration_id: ids of the running iteration; ``None`` outside one.
        extra: anything else a tool source needs (read-only by convention).
        idempotency_key: set for each ``write`` and ``destructive`` call of an iteration: the
            same for every attempt at that call (iteration id, round, position), different for
            every other call. A tool that applies its effect at most once per key (and can
            report what an earlier attempt did: ``ToolSpec.outcome_of``) makes a call that was
            in flight when a worker died safe; ``None`` for reads and outside an iteration.
        round, position: the call's round (1-based) and position in it (0-based), for a
            ``write`` or ``destructive`` call (``None`` otherwise).
        approval: a person's decision on this very call, when the gate asked for one and the
            run resumed with it (``planner.approvals.Approval``): the gate reads it, a handler
            may (who approved); ``None`` otherwise.
    """

    user_id: str
    agent_id: int | None = None
    mission_id: int | None = None
    iteration_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    round: int | None = None
    position: int | None = None
    approval: Approval | None = None

    def for_call(self, round: int, position: int, approval: Approval | None = None) -> ToolContext:
        """This context for call ``position`` (0-based) of ``round`` (1-based): with them, its
        idempotency key ``"<iteration id>:<round>:<position>"`` (no key outside an
        iteration) and the call's ``approval`` (``None``: none)."""
        key = None if self.iteration_id is None else f"{self.iteration_id}:{round}:{position}"
        return dataclasses.replace(
            self, idempotency_key=key, round=round, position=position, approval=approval
        )


ToolHandler = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
OutcomeLookup = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
EffectHandler = Callable[[dict[str, Any], ToolContext, Any], Awaitable[Any]]
"""``async (arguments, ctx, connection) -> result``: ``ToolSpec.effect``."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool.

    Attributes:
        name: unique within a registry; ``^[a-zA-Z0-9_-]{1,64}$`` (the OpenAI function-name rule).
        description: what the tool does, for the model.
        input_schema: JSON Schema (draft 2020-12) of the arguments object.
        policy_hint: ``read`` (no side effects), ``write`` or ``destructive`` (irreversible).
        scope: a grouping the policy gate can opt users into (default ``user-space``).
        handler: ``async (arguments, ctx) -> result``; the result must be JSON-serialisable
            (anything else is stringified). Raising makes the call an error tool result.
        timeout_s: seconds one call may run before it is cancelled and answered with an
            error result; ``None`` (default): ``planner.execution.DEFAULT_TOOL_TIMEOUT_S``.
        outcome_of: for a ``write`` or ``destructive`` tool, ``async (arguments, ctx) ->
            report``: what the tool can tell about a call with ``ctx.idempotency_key`` that was
            in flight when its worker died (e.g. "note 7 exists, created by that call"), or
            ``None`` when it cannot tell. Read by the resuming worker and shown to the model;
            must not change anything. ``None`` (default): the model is told the outcome is
            unknown.
        idempotent: the tool applies a call's effect at most once per
            ``ctx.idempotency_key`` (a second call with the same key has no further effect and
            answers what the first did; MCP's ``idempotentHint``). A ``write`` of such a tool
            that was in flight when its run stopped runs again on resume, with the same key,
            instead of being reported as of unknown outcome. Default ``False``.
        effect: for a tool whose effect lives in its consumer's own database (mana-ai's
            notes): ``async (arguments, ctx, connection) -> result``, the handler's work on
            ``connection``, inside a transaction its consumer owns. A consumer that journals
            its calls (the mission runner) commits that transaction together with the call's
            record, so the call's outcome is never unknown: a call found started after its
            worker died never took effect, and runs again (with its approval, if it had
            one). ``handler`` runs it in a transaction of its own. ``None`` (default): none.
        describe: for a ``write`` or ``destructive`` tool, ``async (arguments, ctx) -> text``:
            what the call would act on, read back for the person who reviews it (``note 8,
            "Q3 plan", 412 characters``), or ``None`` when there is nothing to say; must not
            change anything. Asked when the gate parks a call for approval (at most
            ``planner.call_execution.DESCRIBE_TIMEOUT_S``; a failure or a timeout is said in the
            text instead) and stored with the request. ``None`` (default): no read-back.

    Raises:
        ToolRegistryError: at construction, for an invalid name, JSON schema or timeout.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    policy_hint: PolicyHint
    handler: ToolHandler
    scope: str = "user-space"
    timeout_s: float | None = None
    outcome_of: OutcomeLookup | None = None
    idempotent: bool = False
    effect: EffectHandler | None = None
    describe: OutcomeLookup | None = None

    def __post_init__(self) -> None:
        """Check the name, the schema and the timeout once, at construction (raises
        ToolRegistryError)."""
        if not _valid_name(self.name):
            raise ToolRegistryError(f"invalid tool name {self.name!r}: use 1-64 of [a-zA-Z0-9_-]")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ToolRegistryError(
                f"invalid timeout_s for tool {self.name!r}: {self.timeout_s} (must be > 0)"
            )
        try:
            key = json.dumps(self.input_schema, sort_keys=True)
        except (TypeError, ValueError, RecursionError):  # not JSON: checked, never cached
            problem = _schema_problem(self.input_schema)
        else:
            problem = _cached_schema_problem(key, self.input_schema)
        if problem is not None:
            raise ToolRegistryError(f"invalid JSON schema for tool {self.name!r}: {problem}")

    def with_handler(self, handler: ToolHandler) -> ToolSpec:
        """This tool with ``handler`` in place of its own (a consumer's wrapper around it, made
        per run): the same name, schema and hints, and the checks and compiled validators of
        this spec shared rather than made again (``dataclasses.replace`` would check the
        schema and compile its validators anew for every run)."""
        copy = object.__new__(ToolSpec)
        copy.__dict__.update(self.__dict__)
        copy.__dict__["handler"] = handler
        return copy

    @cached_property
    def _validator(self) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(self.input_schema, registry=_OFFLINE_REGISTRY)

    @cached_property
    def _fast_validator(self) -> Any:
        """jsonschema-rs's compiled validator (about 50 times faster than ``jsonschema`` on
        small arguments), or ``None`` when it cannot compile the schema (then ``jsonschema``
        alone judges). It never fetches a referenced schema (``_refuse_retrieval``)."""
        try:
            return jsonschema_rs.validator_for(self.input_schema, retriever=_refuse_retrieval)
        except Exception:  # e.g. a pattern its regex engine does not support
            return None

    @cached_property
    def openai_tool_chars(self) -> int:
        """Characters of ``json.dumps(self.to_openai_tool())`` (what the loop's context
        estimate counts for this tool's definition), worked out once: like the validators, it
        takes the schema as it was at construction."""
        return len(json.dumps(self.to_openai_tool()))

    def to_openai_tool(self) -> dict[str, Any]:
        """This tool in the OpenAI ``tools`` array format: a new dict each time, around the
        same ``function`` dict, an ``OpenAIFunction`` made once per spec (like the validators,
        from the schema as it was at construction)."""
        return {"type": "function", "function": self._openai_function}

    @cached_property
    def _openai_function(self) -> OpenAIFunction:
        return OpenAIFunction(
            name=self.name, description=self.description, parameters=self.input_schema
        )

    def validate_arguments(self, arguments: dict[str, Any]) -> str | None:
        """Check ``arguments`` against ``input_schema``.

        Returns ``None`` when valid, else a one-line message naming the failing path, for the
        model to read. Valid arguments (the common case) are recognised by jsonschema-rs; the
        message for invalid ones is ``jsonschema``'s best match (or jsonschema-rs's first error
        when the two disagree).
        """
        fast = self._fast_validator
        if fast is not None:
            try:
                if fast.is_valid(arguments):
                    return None
            except Exception:  # arguments it cannot read: let jsonschema judge
                fast = None
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        except RecursionError:
            return f"invalid arguments for {self.name}: nested too deeply to check"
        except Unresolvable as exc:  # a local reference to nowhere: the schema's fault
            return f"the schema of {self.name} cannot be checked: {exc}"[:500]
        if error is None:
            if fast is None:
                return None
            first = next(iter(fast.iter_errors(arguments)), None)
            if first is None:
                return None
            where = "/".join(str(p) for p in first.instance_path) or "(root)"
            return f"invalid arguments for {self.name} at {where}: {first.message}"
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"invalid arguments for {self.name} at {where}: {error.message}"


class ToolRegistry:
    """Tools by name, in registration order.

    Raises:
        ToolRegistryError: on a duplicate name (names and schemas are checked by ToolSpec).
    """

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec) -> None:
        """Add one tool (raises ToolRegistryError, see the class docstring)."""
        if spec.name in self._specs:
            raise ToolRegistryError(f"duplicate tool name {spec.name!r}")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec | None:
        """The tool called ``name``, or ``None``."""
        return self._specs.get(name)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._specs)

    def specs(self) -> list[ToolSpec]:
        """Registered tools, in registration order."""
        return list(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs


_REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _refuse_retrieval(uri: str) -> Any:
    """The retriever of both validators: a referenced schema is never fetched (a tool schema
    from an outside source must not make the worker send requests)."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs alias mypy cannot see


# ``retrieve`` is an attrs field alias, which mypy's attrs plugin does not see.
_OFFLINE_REGISTRY: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


SCHEMA_CHECKS_CACHED = 1024
"""Distinct input schemas whose check is remembered: a worker builds the same tools for every
run, and checking a schema against the JSON Schema metaschema costs about 2 ms of CPU."""

_schema_cache: dict[str, str | None] = {}


def _cached_schema_problem(key: str, schema: Any) -> str | None:
    """``_schema_problem(schema)``, remembered by its canonical JSON ``key`` (at most
    ``SCHEMA_CHECKS_CACHED`` schemas; past that, the oldest is forgotten)."""
    try:
        return _schema_cache[key]
    except KeyError:
        pass
    problem = _schema_problem(schema)
    if len(_schema_cache) >= SCHEMA_CHECKS_CACHED:
        del _schema_cache[next(iter(_schema_cache))]
    _schema_cache[key] = problem
    return problem


def _schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is no usable JSON Schema (draft 2020-12, references only into itself),
    or ``None``."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return str(exc.message)
    except RecursionError:
        return "nested too deeply to check"
    remote = _non_local_reference(schema)
    if remote is not None:
        return (
            f"reference {remote[:200]!r} is not local; only references into the schema itself "
            "('#...') are supported (remote schemas are never fetched)"
        )
    return None


def _non_local_reference(schema: Any) -> str | None:
    """The first ``$ref`` (``$dynamicRef``, ``$recursiveRef``) of ``schema`` that does not
    point into the schema itself (``#...``), or ``None``. Iterative, so any depth is fine."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _REFERENCE_KEYWORDS and isinstance(value, str):
                    if not value.startswith("#"):
                        return value
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
