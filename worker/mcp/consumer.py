"""The MCP server as a consumer of the tools: the built-in ``ToolSpec``s, behind the same gate.

``ServedTools.call`` runs one MCP ``tools/call`` exactly as the planner loop runs one call of
a mission (``planner.execution.execute_calls``): an unknown tool or invalid arguments get an
error without reaching the gate; otherwise the gate of ``PolicySetup.gate`` (consumer ``mcp``,
the MCP server's exposed scopes, the user's opt-ins and rate limits read for this call)
decides, and a denied call in ``enforce`` never runs. Every call is recorded in
``tool_invocations`` (consumer ``mcp``) and counted; the decision is counted by the gate's
observer in ``mana_ai_policy_decisions_total{consumer="mcp"}``.

The tool list offered to clients is the exposed one, each tool with its JSON schema and MCP
annotations derived from its policy hint (``read`` → ``readOnlyHint``, ``destructive`` →
``destructiveHint``, ``write`` → neither).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import mcp.types as types

from planner import PolicyMode, ToolCall, ToolContext, ToolRegistry, ToolSpec
from planner.calls import ExecutedCall
from planner.errors import RunInterrupted
from planner.execution import execute_calls
from planner.policy import UserPolicySettings
from worker import metrics
from worker.policy_setup import PolicySetup
from worker.store.mcp_tokens import McpPrincipal, McpStore
from worker.store.rows import call_outcome, invocation_row, json_safe

__all__ = ["ServedTools", "tool_annotations"]

logger = logging.getLogger(__name__)

MAX_RECORDED_NAME_CHARS = 200
"""A tool name a client invented is recorded cut to this length (it is the client's text)."""


def tool_annotations(spec: ToolSpec) -> types.ToolAnnotations:
    """MCP annotations of ``spec`` from its policy hint (MCP's defaults, e.g. a destructive
    ``destructiveHint`` when nothing is said, are never left to apply)."""
    if spec.policy_hint == "read":
        return types.ToolAnnotations(read_only_hint=True)
    return types.ToolAnnotations(
        read_only_hint=False, destructive_hint=spec.policy_hint == "destructive"
    )


class ServedTools:
    """The tools ``mana-ai mcp serve`` offers, and its one call path.

    Args:
        tools: every built-in tool (those outside the exposed scopes are not listed; a call
            of one is decided by the gate: ``scope_not_exposed``).
        policy: the MCP consumer's policy setup (consumer ``mcp``, ``MANA_AI_MCP_SCOPES``).
        store: where calls are recorded.
        user_settings: ``async user_id -> UserPolicySettings``, read for every call, so an
            opt-in or a revocation applies to the next call.
        tool_timeout_s: seconds a call may run unless its ToolSpec says otherwise.
    """

    def __init__(
        self,
        *,
        tools: Sequence[ToolSpec],
        policy: PolicySetup,
        store: McpStore,
        user_settings: Callable[[str], Awaitable[UserPolicySettings]],
        tool_timeout_s: float | None,
    ) -> None:
        self.registry = ToolRegistry(tools)
        self.policy = policy
        self.store = store
        self.user_settings = user_settings
        self.tool_timeout_s = tool_timeout_s
        exposed = policy.config.exposed_scopes
        self.exposed = [t for t in tools if exposed is None or t.scope in exposed]
        self._listing = [
            types.Tool(
                name=t.name,
                description=t.description,
                input_schema=t.input_schema,
                annotations=tool_annotations(t),
            )
            for t in self.exposed
        ]
        self._schemas: Mapping[str, dict[str, Any]] = {t.name: t.input_schema for t in self.exposed}

    def listing(self) -> list[types.Tool]:
        """The exposed tools as MCP ``Tool``s, in registry order."""
        return list(self._listing)

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """The JSON schema of exposed tool ``name`` (``None``: no such tool)."""
        return self._schemas.get(name)

    async def call(
        self,
        principal: McpPrincipal,
        name: str,
        arguments: dict[str, Any] | None,
        *,
        call_id: str | None = None,
    ) -> types.CallToolResult:
        """Run one ``tools/call`` for ``principal`` (see the module docstring). A refusal or a
        failure is a tool error (``isError``) whose text says why, never an exception; a
        database failure while recording is logged and does not change the answer."""
        call = ToolCall(id=call_id or uuid.uuid4().hex, name=name, arguments=arguments or {})
        ctx = ToolContext(user_id=principal.user_id, extra={"consumer": "mcp"})
        try:
            settings = await self.user_settings(principal.user_id)
        except Exception as exc:
            logger.warning(
                "MCP call of %s refused: the policy settings of user %s could not be read (%s: %s)",
                name[:MAX_RECORDED_NAME_CHARS],
                principal.user_id,
                type(exc).__name__,
                exc,
            )
            message = (
                f"{name[:MAX_RECORDED_NAME_CHARS]} did not run: mana-ai could not read the "
                "policy settings of your user (its database did not answer); try again later"
            )
            return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)
        gate = self.policy.gate(user_settings=settings)
        try:
            [executed] = await execute_calls(
                [call],
                round=1,
                registry=self.registry,
                ctx=ctx,
                policy=gate,
                max_parallel_reads=1,
                tool_timeout_s=self.tool_timeout_s,
            )
        except RunInterrupted as exc:  # a tool's own database failed: the client may retry
            logger.warning("MCP call of %s failed: %s", name[:MAX_RECORDED_NAME_CHARS], exc)
            spec = self.registry.get(name)
            effect = (
                "; its outcome is unknown: check before calling it again"
                if spec is not None and spec.policy_hint != "read"
                else "; try again later"
            )
            executed = ExecutedCall(
                1, call, None, f"{name} failed: mana-ai's database did not answer{effect}", ran=True
            )
        await self._record(principal, executed, PolicyMode.OFF if gate is None else gate.mode)
        return _result(executed)

    async def _record(
        self, principal: McpPrincipal, executed: ExecutedCall, mode: PolicyMode
    ) -> None:
        outcome = call_outcome(executed)
        known = executed.call.name in self.registry
        metrics.MCP_TOOL_CALLS.labels(
            tool=executed.call.name if known else "(unknown)", outcome=outcome
        ).inc()
        row = invocation_row(executed, attempt=1, policy_mode=mode)
        if not known:
            row = dataclasses.replace(row, tool=row.tool[:MAX_RECORDED_NAME_CHARS])
        try:
            await self.store.record_call(principal, row)
        except Exception as exc:  # the call happened: the client gets its answer anyway
            logger.error(
                "could not record the MCP call %s of %s (user %s): %s: %s",
                executed.call.id,
                row.tool,
                principal.user_id,
                type(exc).__name__,
                exc,
            )


def _result(executed: ExecutedCall) -> types.CallToolResult:
    """The MCP answer of ``executed``: its result as JSON text (a string as is; an object also
    as structured content), or its error text with ``isError``."""
    if executed.error is not None:
        return types.CallToolResult(content=[types.TextContent(text=executed.error)], is_error=True)
    value = json_safe(executed.result)
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False)
    structured = value if isinstance(value, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured
    )
