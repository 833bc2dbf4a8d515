"""The policy gate's decision value.

A decision is a value the loop acts on: ``allow=True`` runs the call; ``allow=False`` turns it
into an error tool result carrying ``reason`` (the model reads it) and the handler never runs.
``flags`` records what the gate noticed without blocking (e.g. ``injection-marker``).

The rules themselves (``evaluate_policy``: destructive opt-in, per-user rate limits, injection
markers, ``off`` / ``log-only`` / ``enforce``) arrive with the policy-gate issue; until then the
loop takes any async ``PolicyGate`` callable, and ``None`` allows every call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel, ConfigDict

from planner.messages import ToolCall
from planner.tools import ToolContext, ToolSpec

__all__ = ["PolicyDecision", "PolicyGate"]


class PolicyDecision(BaseModel):
    """Whether one tool call may run.

    Attributes:
        allow: run the call (``True``) or deny it (``False``).
        reason: why it was denied (or flagged); shown to the model on a denial.
        reminder: an optional hint for the next request's reminder channel.
        flags: what the gate noticed without blocking, e.g. ``("injection-marker",)``.
    """

    model_config = ConfigDict(frozen=True)

    allow: bool
    reason: str | None = None
    reminder: str | None = None
    flags: tuple[str, ...] = ()


PolicyGate = Callable[[ToolSpec, ToolCall, ToolContext], Awaitable[PolicyDecision]]
"""``async (spec, call, ctx) -> PolicyDecision``, awaited before a known tool's handler runs."""
