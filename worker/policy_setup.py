"""The policy gate's wiring for any consumer of the tools (a mission's run, an MCP client of
``mana-ai mcp serve``): one ``PolicySetup`` built from the settings, the gate it gives, and the
metrics and log lines of every decision.

The rules are ``planner.policy.evaluate_policy``; counting is a ``CallLedger``
(``worker.store.ledger.PostgresCallLedger``). Both consumers build their gate here, so that every
call of either applies the same rules and is observed the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

from prometheus_client import Counter

from planner import ToolCall, ToolContext, ToolSpec
from planner.gate import CallLedger, DecisionObserver, RulePolicyGate
from planner.markers import DEFAULT_INJECTION_MARKERS
from planner.policy import (
    INJECTION_MARKER,
    INSPECTION_TRUNCATED,
    DestructivePolicy,
    PolicyConfig,
    PolicyDecision,
    PolicyMode,
    RateLimit,
    UserPolicySettings,
)
from worker import metrics
from worker.approval_webhook import ApprovalWebhook
from worker.settings import Settings

__all__ = ["PolicySetup", "decision_observer", "policy_config_from_settings"]

logger = logging.getLogger(__name__)


def policy_config_from_settings(
    settings: Settings, *, exposed_scopes: frozenset[str] | None = None
) -> PolicyConfig:
    """The ``PolicyConfig`` of ``settings``: rate limit and window, per-tool limits, the
    built-in injection markers plus ``MANA_AI_POLICY_INJECTION_MARKERS``, and the scopes the
    consumer exposes (``None``: every scope)."""
    return PolicyConfig(
        rate_limit=RateLimit(
            calls=settings.policy.rate_limit,
            window=timedelta(seconds=settings.policy.rate_window_s),
        ),
        tool_rate_limits=dict(settings.policy.tool_rate_limits),
        injection_markers=tuple(
            dict.fromkeys((*DEFAULT_INJECTION_MARKERS, *settings.policy.injection_markers))
        ),
        exposed_scopes=exposed_scopes,
    )


_VERBS = {
    (False, False): "denied",
    (False, True): "would deny (log-only)",
    (True, False): "asks a person about",
    (True, True): "would ask a person about (log-only)",
}
"""How a log line says what the gate did: ``(asked, allowed) -> verb``."""


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
            metrics.POLICY_INJECTION_FLAGS.labels(tool=metrics.tool_label(spec.name)).inc()
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
        if decision.verdict in ("deny", "ask"):
            ask = decision.verdict == "ask"
            logger.warning(
                "policy %s %s (call %s, user %s): %s: %s",
                _VERBS[(ask, decision.allow)],
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
        default_destructive: ``MANA_AI_POLICY_DESTRUCTIVE``: ``deny`` or ``ask`` for a
            destructive call without opt-in (an agent may override it).
        approval_ttl: how long an approval request waits for a decision
            (``MANA_AI_APPROVAL_TTL_S``, default one day).
        webhook: notified of every new approval request (``MANA_AI_APPROVAL_WEBHOOK_URL``);
            ``None``: nobody is.
    """

    default_mode: PolicyMode
    config: PolicyConfig
    ledger: CallLedger
    consumer: str = "mission"
    default_destructive: DestructivePolicy = DestructivePolicy.DENY
    approval_ttl: timedelta = timedelta(days=1)
    webhook: ApprovalWebhook | None = None

    def gate(
        self,
        *,
        user_settings: UserPolicySettings,
        mode: PolicyMode | None = None,
        ledger: CallLedger | None = None,
        destructive: DestructivePolicy | None = None,
    ) -> RulePolicyGate | None:
        """The gate for one iteration (or request) of the user with ``user_settings``, in
        ``mode`` (default: ``default_mode``), counting in ``ledger`` (default: ``self.ledger``;
        a run passes it wrapped in ``LeaseBoundLedger``), asking or denying destructive calls
        without opt-in as ``destructive`` says (default: ``default_destructive``); ``None``
        when the mode is ``off``."""
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
            destructive=destructive or self.default_destructive,
        )
