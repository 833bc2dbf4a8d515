"""The policy gate in the worker: one ``PolicySetup`` built from the settings, and the gate
each consumer (the mission runner, later the MCP server) asks it for.

The rules are ``planner.policy.evaluate_policy``; counting is ``PostgresCallLedger``. This
module only wires them and turns every decision into metrics and log lines, so that every
consumer of the tools applies the same rules and is observed the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING

from prometheus_client import Counter

from planner import RunInterrupted, ToolCall, ToolContext, ToolSpec
from planner.policy import (
    DEFAULT_INJECTION_MARKERS,
    INJECTION_MARKER,
    INSPECTION_TRUNCATED,
    CallLedger,
    DecisionObserver,
    PolicyConfig,
    PolicyDecision,
    PolicyMode,
    RateLimit,
    Reservation,
    RulePolicyGate,
    UserPolicySettings,
)
from worker import metrics
from worker.run.leases import HeldLease
from worker.store.engine import describe_error
from worker.store.transient import is_transient

if TYPE_CHECKING:
    from worker.run.journal import MissionJournal
from worker.settings import Settings

__all__ = [
    "LeaseBoundLedger",
    "MissionGate",
    "PolicySetup",
    "decision_observer",
    "policy_config_from_settings",
]

logger = logging.getLogger(__name__)


def policy_config_from_settings(
    settings: Settings, *, exposed_scopes: frozenset[str] | None = None
) -> PolicyConfig:
    """The ``PolicyConfig`` of ``settings``: rate limit and window, per-tool limits, the
    built-in injection markers plus ``MANA_AI_POLICY_INJECTION_MARKERS``, and the scopes the
    consumer exposes (``None``: every scope)."""
    return PolicyConfig(
        rate_limit=RateLimit(
            calls=settings.policy_rate_limit,
            window=timedelta(seconds=settings.policy_rate_window_s),
        ),
        tool_rate_limits=dict(settings.policy_tool_rate_limits),
        injection_markers=tuple(
            dict.fromkeys((*DEFAULT_INJECTION_MARKERS, *settings.policy_injection_markers))
        ),
        exposed_scopes=exposed_scopes,
    )


def decision_observer(consumer: str) -> DecisionObserver:
    """Counts every decision (``mana_ai_policy_decisions_total``, and
    ``mana_ai_policy_injection_flags_total`` for flagged calls) and logs denials, would-be
    denials and flags as warnings (the ids of the mission come from the log context)."""

    def observe(spec: ToolSpec, call: ToolCall, ctx: ToolContext, decision: PolicyDecision) -> None:
        _decision_counter(
            consumer,
            decision.verdict or ("allow" if decision.allow else "deny"),
            decision.reason or "allowed",
            decision.mode or "unknown",
        ).inc()
        if INJECTION_MARKER in decision.flags:
            metrics.POLICY_INJECTION_FLAGS.labels(tool=spec.name).inc()
            logger.warning(
                "injection marker(s) %s in the arguments of %s (call %s, user %s): flagged, "
                "not blocked",
                list(decision.markers),
                spec.name,
                call.id,
                ctx.user_id,
            )
        if INSPECTION_TRUNCATED in decision.flags:
            logger.info("arguments of %s (call %s) too large to scan in full", spec.name, call.id)
        if decision.verdict == "deny":
            logger.warning(
                "policy %s %s (call %s, user %s): %s: %s",
                "denied" if not decision.allow else "would deny (log-only)",
                spec.name,
                call.id,
                ctx.user_id,
                decision.reason,
                decision.message,
            )

    return observe


@cache
def _decision_counter(consumer: str, decision: str, reason: str, mode: str) -> Counter:
    """The labelled child of ``mana_ai_policy_decisions_total`` (looked up once: ``labels()``
    costs microseconds on every call otherwise)."""
    return metrics.POLICY_DECISIONS.labels(
        consumer=consumer, decision=decision, reason=reason, mode=mode
    )


@dataclass(frozen=True)
class PolicySetup:
    """The policy configuration of one consumer, built once at start.

    Attributes:
        default_mode: ``MANA_AI_POLICY_MODE`` (an agent may override it).
        config: rules configuration (limits, markers, exposed scopes).
        ledger: the rate-limit ledger shared by every replica.
        consumer: ``mission`` or ``mcp`` (metric label, recorded with each slot).
    """

    default_mode: PolicyMode
    config: PolicyConfig
    ledger: CallLedger
    consumer: str = "mission"

    def gate(
        self,
        *,
        user_settings: UserPolicySettings,
        mode: PolicyMode | None = None,
        ledger: CallLedger | None = None,
    ) -> RulePolicyGate | None:
        """The gate for one iteration (or request) of the user with ``user_settings``, in
        ``mode`` (default: ``default_mode``), counting in ``ledger`` (default: ``self.ledger``;
        a run passes it wrapped in ``LeaseBoundLedger``); ``None`` when the mode is ``off``."""
        effective = mode or self.default_mode
        if effective == "off":
            return None
        return RulePolicyGate(
            mode=effective,
            config=self.config,
            user_settings=user_settings,
            ledger=ledger or self.ledger,
            consumer=self.consumer,
            observe=decision_observer(self.consumer),
        )


class LeaseBoundLedger:
    """A mission run's ``CallLedger``: ``ledger``'s reservations with their transient database
    failures retried while the run's lease holds (``HeldLease.retry``), and ``RunInterrupted``
    raised when they outlast it, so that the gate (in ``enforce``) stops the run instead of
    denying the call with ``policy_unavailable``: an unreachable ledger is the runner's fault
    to recover, not the model's to work around.

    Args:
        ledger: the shared ledger (``PostgresCallLedger``).
        lease: the run's lease.
    """

    def __init__(self, ledger: CallLedger, lease: HeldLease) -> None:
        self.ledger = ledger
        self.lease = lease

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        """See ``planner.policy.CallLedger.reserve``.

        Raises:
            RunInterrupted: the ledger's database stayed unreachable while the lease held.
            Exception: what the ledger raised for any other reason.
        """
        try:
            return await self.lease.retry(
                lambda: self.ledger.reserve(
                    user_id=user_id, tool=tool, limit=limit, consumer=consumer
                ),
                what=f"reserving a rate-limit slot for {tool}",
            )
        except Exception as exc:
            if not is_transient(exc):
                raise
            raise RunInterrupted(
                f"the policy gate's rate-limit ledger did not answer for {tool} "
                f"({describe_error(exc)})"
            ) from exc


class MissionGate:
    """The policy gate of one mission run: ``gate`` (``RulePolicyGate``), with the rate-limit
    reservation of a ``write`` or ``destructive`` call made by the journal, in the statement
    that records the call's start (``MissionJournal.start_reserved``): one round trip for the
    gate and the journal, not two. Reads reserve through the gate's ledger as usual.

    Raises (from a call): ``RunInterrupted`` when the write's start cannot be recorded (the
    database stayed unreachable, or the lease was lost), in either mode: a write never runs
    unrecorded.
    """

    def __init__(self, gate: RulePolicyGate, journal: MissionJournal) -> None:
        self.gate = gate
        self.journal = journal

    async def __call__(self, spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        """Decide ``call`` (``ctx`` is the call's own, with its round and position)."""
        gate = self.gate
        if spec.policy_hint == "read" or ctx.round is None or ctx.position is None:
            return await gate(spec, call, ctx)
        inp, decision = gate.rules(spec, call, ctx)
        if decision.verdict == "allow":
            reservation = await self.journal.start_reserved(
                call,
                spec,
                ctx,
                round=ctx.round,
                position=ctx.position,
                limit=gate.limit_for(spec),
                consumer=gate.consumer,
                run_anyway=gate.mode != "enforce",
            )
            decision = gate.counted(inp, decision, reservation)
        gate.report(spec, call, ctx, decision)
        return decision
