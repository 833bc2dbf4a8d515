"""Run one round's tool calls and turn each into exactly one tool result message.

Every call the model issued gets one result, whatever happens: an unknown tool, arguments that
are not valid JSON or fail the tool's schema, a policy denial and a handler that raises all
become an *error tool result* that the model reads on the next round. Nothing here raises for
those; only cancellation propagates.

Calls run one at a time, in the order the model issued them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.messages import ChatMessage, ToolCall
from planner.policy import PolicyDecision, PolicyGate
from planner.tools import ToolContext, ToolRegistry

__all__ = [
    "ExecutedCall",
    "ToolCallExecutor",
    "denial_text",
    "execute_calls",
    "tool_result_message",
]

ToolCallExecutor = Callable[[ToolCall], Awaitable[Any]]


@dataclass(frozen=True)
class ExecutedCall:
    """One tool call and its outcome.

    Attributes:
        round: the 1-based round the call was issued in.
        call: the call as the model issued it.
        result: the handler's return value (``None`` on error).
        error: the error text the model read, or ``None`` on success.
        decision: the policy decision, or ``None`` when no gate ran (no gate, or unknown tool).
        duration_ms: wall time spent on the call, gate included, in milliseconds.
    """

    round: int
    call: ToolCall
    result: Any
    error: str | None
    decision: PolicyDecision | None = None
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the call ran and returned without error."""
        return self.error is None


def tool_result_message(executed: ExecutedCall) -> ChatMessage:
    """The tool message answering ``executed.call``.

    Content is the result as JSON (a ``str`` result is sent as is), or ``{"error": "..."}``.
    """
    if executed.error is not None:
        content = json.dumps({"error": executed.error}, ensure_ascii=False)
    elif isinstance(executed.result, str):
        content = executed.result
    else:
        content = json.dumps(executed.result, ensure_ascii=False, default=str)
    return ChatMessage(role="tool", content=content, tool_call_id=executed.call.id)


def denial_text(decision: PolicyDecision) -> str:
    """The error a refused call's tool result carries, e.g. ``denied by policy
    (destructive_not_opted_in): notes_delete is destructive and …``."""
    reason = decision.reason or "no reason given"
    if decision.message:
        return f"denied by policy ({reason}): {decision.message}"
    return f"denied by policy: {reason}"


async def execute_calls(
    calls: Sequence[ToolCall],
    *,
    round: int,
    registry: ToolRegistry,
    ctx: ToolContext,
    policy: PolicyGate | None = None,
    executor: ToolCallExecutor | None = None,
    on_executed: Callable[[ExecutedCall], None] | None = None,
) -> list[ExecutedCall]:
    """Run ``calls`` in order; return one ExecutedCall per call, in the same order.

    Args:
        calls: the tool calls of one assistant message.
        round: the 1-based round number (recorded on each ExecutedCall).
        registry: the tools the model may call.
        ctx: passed to every handler.
        policy: awaited before each known tool runs; a denial skips the handler.
        executor: when given, runs each allowed call instead of the spec's handler.
        on_executed: called with each ExecutedCall as soon as that call finished.
    """
    done: list[ExecutedCall] = []
    for call in calls:
        executed = await _execute_one(
            call, round=round, registry=registry, ctx=ctx, policy=policy, executor=executor
        )
        done.append(executed)
        if on_executed is not None:
            on_executed(executed)
    return done


async def _execute_one(
    call: ToolCall,
    *,
    round: int,
    registry: ToolRegistry,
    ctx: ToolContext,
    policy: PolicyGate | None,
    executor: ToolCallExecutor | None,
) -> ExecutedCall:
    started = time.perf_counter()

    def done(result: Any, error: str | None, decision: PolicyDecision | None) -> ExecutedCall:
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        return ExecutedCall(round, call, result, error, decision, elapsed_ms)

    spec = registry.get(call.name)
    if spec is None:
        known = ", ".join(registry.names()) or "(none)"
        return done(None, f"unknown tool {call.name!r}; available tools: {known}", None)
    if call.parse_error is not None:
        return done(
            None, f"could not parse the arguments for {call.name}: {call.parse_error}", None
        )
    invalid = spec.validate_arguments(call.arguments)
    if invalid is not None:
        return done(None, invalid, None)

    decision: PolicyDecision | None = None
    if policy is not None:
        decision = await policy(spec, call, ctx)
        if not decision.allow:
            return done(None, denial_text(decision), decision)
    try:
        if executor is not None:
            result = await executor(call)
        else:
            result = await spec.handler(dict(call.arguments), ctx)
    except Exception as exc:  # a tool failure is feedback for the model, not a crash
        return done(None, f"{call.name} failed: {type(exc).__name__}: {exc}", decision)
    return done(result, None, decision)
