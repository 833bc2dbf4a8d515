"""The MCP server as a consumer of the tools: the built-in ``ToolSpec``s, behind the same gate.

``ServedTools.call`` runs one MCP ``tools/call`` exactly as the planner loop runs one call of
a mission (``planner.execution.execute_calls``): an unknown tool or invalid arguments get an
error without reaching the gate; otherwise the gate of ``PolicySetup.gate`` (consumer ``mcp``,
the MCP server's exposed scopes, the user's opt-ins and rate limits read for this call)
decides, and a denied call in ``enforce`` never runs.

Approvals (``MANA_AI_POLICY_DESTRUCTIVE=ask``): a client cannot wait, so a destructive call the
gate asks about is refused with a tool error that names its approval request (one pending
request per user, tool and arguments: calling again does not ask again). Once a person
approved it, the same call (same user, tool and arguments) is allowed once, until the request's
time to live ends: the approval is marked used as the call is allowed (``ApprovalStore.use``),
so two calls racing for it cannot both run. Once a person denied it, the same call is refused
with who denied it and why until then, instead of being asked about again. Every call is recorded in
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

from planner import (
    Approval,
    ApprovalStatus,
    PolicyDecision,
    PolicyMode,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    arguments_hash,
)
from planner.call_execution import described
from planner.calls import ExecutedCall
from planner.errors import RunInterrupted
from planner.execution import execute_calls
from planner.gate import RulePolicyGate
from planner.policy import (
    APPROVAL_USED,
    APPROVED,
    POLICY_UNAVAILABLE,
    PolicyVerdict,
    UserPolicySettings,
)
from worker import metrics, redaction
from worker.policy_setup import PolicySetup
from worker.queries.approval_requests import ApprovalStore
from worker.queries.mcp_tokens import McpPrincipal, McpStore
from worker.store.records import ApprovalRequestRow
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
        approvals: where approval requests live (``None``: on ``store``'s database).
    """

    def __init__(
        self,
        *,
        tools: Sequence[ToolSpec],
        policy: PolicySetup,
        store: McpStore,
        user_settings: Callable[[str], Awaitable[UserPolicySettings]],
        tool_timeout_s: float | None,
        approvals: ApprovalStore | None = None,
    ) -> None:
        self.registry = ToolRegistry(tools)
        self.policy = policy
        self.store = store
        self.user_settings = user_settings
        self.tool_timeout_s = tool_timeout_s
        self.approvals = approvals or ApprovalStore(store.engine)
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
        # the call as it runs, is stored and is shown for approval: its text storable
        # (ToolCall) and the process's secrets masked (worker.redaction)
        call = ToolCall(
            id=call_id or uuid.uuid4().hex,
            name=name,
            arguments=redaction.redact_json(arguments or {}),
        )
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
            approval = await self._approval(gate, principal, call)
            [executed] = await execute_calls(
                [call],
                round=1,
                registry=self.registry,
                ctx=ctx,
                policy=None if gate is None else self._asking(gate, principal),
                max_parallel_reads=1,
                tool_timeout_s=self.tool_timeout_s,
                approvals=None if approval is None else {0: approval},
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

    async def _approval(
        self, gate: RulePolicyGate | None, principal: McpPrincipal, call: ToolCall
    ) -> Approval | None:
        """A person's decision on exactly this call by this user that still stands: an
        approval not used yet, or a denial (``ApprovalStore.mcp_decision``; only looked up for
        a destructive call the gate would ask about)."""
        spec = self.registry.get(call.name)
        if (
            gate is None
            or gate.destructive != "ask"
            or spec is None
            or spec.policy_hint != "destructive"
            or gate.user_settings.opted_in(spec)
            or call.parse_error is not None
        ):
            return None
        try:
            digest = arguments_hash(call.arguments)
        except (TypeError, ValueError):
            return None
        try:
            row = await self.approvals.mcp_decision(principal.user_id, call.name, digest)
        except Exception as exc:  # the gate then asks, and says what failed
            logger.warning("could not look up the approvals of %s: %s", call.name, exc)
            return None
        if row is None:
            return None
        return Approval(
            request_id=int(row["id"]),
            status=ApprovalStatus(row["status"]),
            tool=row["tool"],
            arguments_hash=row["arguments_hash"],
            decided_by=row["decided_by"],
            reason=row["decision_note"],
            decided_at=row["decided_at"],
            target=row.get("target"),
        )

    def _asking(
        self, gate: RulePolicyGate, principal: McpPrincipal
    ) -> Callable[[ToolSpec, ToolCall, ToolContext], Awaitable[PolicyDecision]]:
        """``gate`` for an MCP client: a call it asks about gets its approval request (the
        pending one of the same call, or a new one: the webhook is told) named in the refusal;
        an approved call uses its approval up, or is refused when another call did first."""

        async def decide(spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
            decision = await gate(spec, call, ctx)
            try:
                if decision.parks:
                    return await self._asked(
                        decision, principal, call, await described(spec, call, ctx)
                    )
                approval = ctx.approval
                if not (decision.allow and decision.reason == APPROVED and approval is not None):
                    return decision
                used = await self.approvals.use(approval.request_id)
            except Exception as exc:  # the approvals' database: refuse, never run unasked
                logger.warning(
                    "MCP call of %s refused: its approval could not be read or stored (%s: %s)",
                    call.name,
                    type(exc).__name__,
                    exc,
                )
                return PolicyDecision(
                    allow=False,
                    reason=POLICY_UNAVAILABLE,
                    verdict=PolicyVerdict.DENY,
                    mode=decision.mode,
                    message=f"{call.name} needs a person's approval, and mana-ai could not "
                    "reach its database to ask for one; try again later",
                )
            if not used:
                return PolicyDecision(
                    allow=False,
                    reason=APPROVAL_USED,
                    verdict=PolicyVerdict.DENY,
                    mode=decision.mode,
                    message=(
                        f"approval request {approval.request_id} allowed one call, and another "
                        "call used it; ask again"
                    ),
                )
            return decision

        return decide

    async def _asked(
        self,
        decision: PolicyDecision,
        principal: McpPrincipal,
        call: ToolCall,
        target: str | None = None,
    ) -> PolicyDecision:
        arguments = json_safe(dict(call.arguments))  # hashed as stored
        request, created = await self.approvals.request_mcp(
            ApprovalRequestRow(
                consumer="mcp",
                user_id=principal.user_id,
                call_id=json_safe(call.id),
                tool=call.name,
                arguments=arguments,
                arguments_hash=arguments_hash(arguments),
                reason=decision.message or "approval needed",
                ttl=self.policy.approval_ttl,
                mcp_token_id=principal.token_id,
                target=json_safe(target) if target else None,
            )
        )
        request_id = request["id"]
        if created:
            metrics.APPROVAL_REQUESTS.labels(consumer="mcp").inc()
            if self.policy.webhook is not None:
                self.policy.webhook.notify(request)
        logger.warning(
            "MCP call of %s (user %s) waits for approval request %d (%s)",
            call.name,
            principal.user_id,
            request_id,
            "new" if created else "asked before",
        )
        expires = request["expires_at"].isoformat(timespec="seconds")
        return decision.model_copy(
            update={
                "message": (
                    f"{call.name} needs a person's approval: approval request {request_id} is "
                    f"pending until {expires} (`mana-ai approvals approve {request_id}`); call "
                    "it again with the same arguments once it is approved"
                )
            }
        )

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
