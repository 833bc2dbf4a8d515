"""The policy gate's rules: ``evaluate_policy()`` decides whether one tool call may run.

``evaluate_policy(PolicyInput) -> PolicyDecision`` is a pure function: no I/O, no clock (the
input carries ``now``). The rules, in the order they are checked:

1. **scope exposure** — a consumer (the mission runner, the MCP server) passes the scopes it
   exposes; a tool outside them is denied (``scope_not_exposed``).
2. **destructive opt-in** — a ``destructive`` tool is denied unless the user opted in to that
   tool or to its scope (``destructive_not_opted_in``); with the destructive policy ``ask``
   (``DestructivePolicy``) the verdict is ``ask`` instead (``approval_required``): a person
   decides (``planner.approvals``). A call that carries a granted ``Approval`` of exactly this
   call passes this rule (reason ``approved``); one whose approval is for another call is
   denied (``approval_mismatch``).
3. **rate limit per user per tool** — at most ``RateLimit.calls`` calls in a rolling
   ``RateLimit.window`` (default 30 per 60 s); the input carries the timestamps of the user's
   recent calls of the tool that took a slot (``rate_limited``). Overrides: per user and tool,
   per user, per tool (operator), then the default.
4. **injection markers** — every string of the arguments, at any depth (keys included), is
   scanned for prompt-injection markers (``{{``, ``<system``, ``ignore previous`` and a
   configurable list). A match never blocks: it sets the ``injection_marker`` flag, and the
   matched markers are listed on the decision. Matching is robust to case, runs of whitespace,
   zero-width and other format characters, combining marks, Unicode compatibility forms (NFKC:
   full-width letters and brackets) and a few bracket look-alikes.

The scan is bounded (``PolicyConfig.max_inspected_chars`` characters and ``max_inspected_nodes``
values per call): arguments of 10 MB or 10,000 levels deep get a decision in bounded time, with
the ``inspection_truncated`` flag saying that not everything was read.

Modes: ``off`` (no rules run, every call allowed), ``log-only`` (rules run and the decision is
recorded, but the call always runs: a denial is a *would-be* denial) and ``enforce`` (a denied
call does not run; a call the rules *ask* about waits for a person: the loop parks it).
``PolicyDecision.verdict`` is what the rules decided (``allow``, ``deny`` or ``ask``),
``allow`` what the loop does.

The seam the loop awaits is ``PolicyGate = async (spec, call, ctx) -> PolicyDecision``;
``planner.gate.RulePolicyGate`` is the gate every consumer uses: it applies ``evaluate_policy``
and takes rate-limit slots from a ``CallLedger`` (PostgreSQL in the worker, in memory in
``planner.testing``), so that counting and reserving a slot are one atomic step. The marker
scan is ``planner.markers``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from planner.approvals import Approval
from planner.markers import (
    DEFAULT_INJECTION_MARKERS,
    MAX_INSPECTED_CHARS,
    MAX_INSPECTED_NODES,
    find_injection_markers,
)
from planner.messages import ToolCall
from planner.policy_modes import POLICY_MODES, DestructivePolicy, PolicyMode
from planner.tools import ToolContext, ToolSpec

__all__ = [
    "ALLOWED",
    "APPROVAL_DENIED",
    "APPROVAL_EXPIRED",
    "APPROVAL_MISMATCH",
    "APPROVAL_REQUIRED",
    "APPROVAL_USED",
    "APPROVED",
    "ARGUMENTS_NOT_OBJECT",
    "DEFAULT_RATE_LIMIT",
    "DENY_REASONS",
    "DESTRUCTIVE_NOT_OPTED_IN",
    "INJECTION_MARKER",
    "INSPECTION_TRUNCATED",
    "POLICY_MODES",
    "POLICY_OFF",
    "POLICY_UNAVAILABLE",
    "RATE_LIMITED",
    "SCOPE_NOT_EXPOSED",
    "TOOL_NOT_OFFERED",
    "DecisionReason",
    "DestructivePolicy",
    "PolicyConfig",
    "PolicyDecision",
    "PolicyGate",
    "PolicyInput",
    "PolicyMode",
    "PolicyVerdict",
    "RateLimit",
    "UserPolicySettings",
    "decide_scanned",
    "evaluate_policy",
]

logger = logging.getLogger(__name__)


class DecisionReason(StrEnum):
    """The built-in gate's reason codes (machine-readable; stored on every decision and used
    as a metric label). A custom ``PolicyGate`` may give its own codes."""

    ALLOWED = "allowed"
    POLICY_OFF = "policy_off"
    SCOPE_NOT_EXPOSED = "scope_not_exposed"
    DESTRUCTIVE_NOT_OPTED_IN = "destructive_not_opted_in"
    RATE_LIMITED = "rate_limited"
    POLICY_UNAVAILABLE = "policy_unavailable"
    APPROVAL_REQUIRED = "approval_required"
    APPROVED = "approved"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_MISMATCH = "approval_mismatch"
    APPROVAL_USED = "approval_used"
    TOOL_NOT_OFFERED = "tool_not_offered"


class PolicyVerdict(StrEnum):
    """What the rules decided, whatever the mode: ``allow``, ``deny``, or ``ask`` (a person
    decides: in ``enforce`` the loop parks the call until then, in ``log-only`` it runs and
    the verdict is a would-be ask)."""

    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


ALLOWED = DecisionReason.ALLOWED
POLICY_OFF = DecisionReason.POLICY_OFF
SCOPE_NOT_EXPOSED = DecisionReason.SCOPE_NOT_EXPOSED
DESTRUCTIVE_NOT_OPTED_IN = DecisionReason.DESTRUCTIVE_NOT_OPTED_IN
RATE_LIMITED = DecisionReason.RATE_LIMITED
POLICY_UNAVAILABLE = DecisionReason.POLICY_UNAVAILABLE
APPROVAL_REQUIRED = DecisionReason.APPROVAL_REQUIRED
APPROVED = DecisionReason.APPROVED
APPROVAL_DENIED = DecisionReason.APPROVAL_DENIED
APPROVAL_EXPIRED = DecisionReason.APPROVAL_EXPIRED
APPROVAL_MISMATCH = DecisionReason.APPROVAL_MISMATCH
APPROVAL_USED = DecisionReason.APPROVAL_USED
TOOL_NOT_OFFERED = DecisionReason.TOOL_NOT_OFFERED
DENY_REASONS = (
    SCOPE_NOT_EXPOSED,
    DESTRUCTIVE_NOT_OPTED_IN,
    RATE_LIMITED,
    POLICY_UNAVAILABLE,
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_MISMATCH,
    APPROVAL_USED,
    TOOL_NOT_OFFERED,
)

# Flags: what the gate noticed without blocking.
INJECTION_MARKER = "injection_marker"
INSPECTION_TRUNCATED = "inspection_truncated"
ARGUMENTS_NOT_OBJECT = "arguments_not_object"

MAX_RATE_LIMIT_CALLS = 100_000
"""Largest accepted ``RateLimit.calls``: the ledger keeps one timestamp per slot taken."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``calls`` calls per rolling ``window``.

    Raises:
        ValueError: ``calls`` outside 1..100,000 or a window that is not positive.
    """

    calls: int
    window: timedelta

    def __post_init__(self) -> None:
        if not 1 <= self.calls <= MAX_RATE_LIMIT_CALLS:
            raise ValueError(
                f"rate limit calls must be 1..{MAX_RATE_LIMIT_CALLS}, got {self.calls}"
            )
        if self.window <= timedelta(0):
            raise ValueError(f"rate limit window must be positive, got {self.window}")

    def describe(self) -> str:
        """E.g. ``30 calls per 60 s``."""
        return f"{self.calls} calls per {self.window.total_seconds():g} s"


DEFAULT_RATE_LIMIT = RateLimit(calls=30, window=timedelta(seconds=60))
"""30 calls per rolling 60 s, per user and tool (the seed design's default)."""


@dataclass(frozen=True, slots=True)
class UserPolicySettings:
    """One user's policy settings (table ``user_policy_settings``).

    Attributes:
        destructive_opt_ins: tool names or scopes whose destructive tools the user allows.
        rate_limit: calls per window for every tool of this user (``None``: the operator's).
        tool_rate_limits: calls per window for one tool of this user (wins over the above).
    """

    destructive_opt_ins: frozenset[str] = frozenset()
    rate_limit: int | None = None
    tool_rate_limits: Mapping[str, int] = field(default_factory=dict)

    def opted_in(self, spec: ToolSpec) -> bool:
        """True when the user opted in to ``spec`` by its name or its scope."""
        return spec.name in self.destructive_opt_ins or spec.scope in self.destructive_opt_ins


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What a consumer configures once (from the operator's settings).

    Attributes:
        rate_limit: the default rate limit per user and tool (30 per 60 s).
        tool_rate_limits: operator overrides of the call count per tool name.
        injection_markers: markers to flag (matched after normalisation, see the module doc).
        exposed_scopes: the scopes this consumer exposes; ``None`` exposes every scope.
        max_inspected_chars, max_inspected_nodes: bounds of the marker scan per call.
    """

    rate_limit: RateLimit = DEFAULT_RATE_LIMIT
    tool_rate_limits: Mapping[str, int] = field(default_factory=dict)
    injection_markers: tuple[str, ...] = DEFAULT_INJECTION_MARKERS
    exposed_scopes: frozenset[str] | None = None
    max_inspected_chars: int = MAX_INSPECTED_CHARS
    max_inspected_nodes: int = MAX_INSPECTED_NODES

    def rate_limit_for(self, tool: str, user: UserPolicySettings) -> RateLimit:
        """The limit that applies to ``user`` calling ``tool``; the most specific setting
        wins: the user's limit for this tool, else the operator's limit for this tool, else the
        user's limit for every tool, else the default."""
        calls, _ = self.rate_limit_source(tool, user)
        if calls == self.rate_limit.calls:
            return self.rate_limit
        return RateLimit(calls=calls, window=self.rate_limit.window)

    def rate_limit_source(self, tool: str, user: UserPolicySettings) -> tuple[int, str]:
        """``(calls, where from)`` of ``rate_limit_for``: ``user+tool``, ``tool``, ``user``
        or ``default``."""
        for calls, source in (
            (user.tool_rate_limits.get(tool), "user+tool"),
            (self.tool_rate_limits.get(tool), "tool"),
            (user.rate_limit, "user"),
        ):
            if calls is not None:
                return calls, source
        return self.rate_limit.calls, "default"


class PolicyDecision(BaseModel):
    """Whether one tool call may run: a value the loop acts on.

    Attributes:
        allow: what the loop does: run the call (``True``) or not run its handler (``False``:
            answered with an error tool result, or, with verdict ``ask``, parked until a
            person decides). Always ``True`` in ``log-only``.
        reason: a machine-readable code (``DecisionReason``): ``allowed``, ``policy_off``,
            ``scope_not_exposed``, ``destructive_not_opted_in``, ``rate_limited``,
            ``policy_unavailable``, ``approval_required``, ``approved``, ``approval_denied``,
            ``approval_expired``, ``approval_mismatch``, ``approval_used`` (an MCP client's
            approval taken by another call already) or ``tool_not_offered`` (an approved call
            whose tool the agent no longer offers).
        verdict: what the rules decided (``allow`` | ``deny`` | ``ask``), whatever the mode: in
            ``log-only`` a ``deny`` or ``ask`` verdict with ``allow=True`` is a would-be denial
            or a would-be request for approval.
        mode: the mode the decision was taken in (``None`` for a hand-made decision).
        message: why, in words, for the model (on a denial) and the operator.
        reminder: a hint for the model's next request (reminder channel), on a denial.
        flags: what the gate noticed without blocking (``injection_marker``,
            ``inspection_truncated``, ``arguments_not_object``).
        markers: the injection markers found, as configured.
    """

    model_config = ConfigDict(frozen=True)

    allow: bool
    reason: str | None = None
    reminder: str | None = None
    flags: tuple[str, ...] = ()
    verdict: PolicyVerdict | None = None
    mode: PolicyMode | None = None
    message: str | None = None
    markers: tuple[str, ...] = ()

    @property
    def denied_by_rules(self) -> bool:
        """True when the rules said deny (enforced or not); hand-made decisions: ``not allow``."""
        return self.verdict == "deny" if self.verdict is not None else not self.allow

    @property
    def parks(self) -> bool:
        """True when the call waits for a person's approval instead of running (verdict
        ``ask`` in ``enforce``)."""
        return self.verdict == "ask" and not self.allow


PolicyGate = Callable[[ToolSpec, ToolCall, ToolContext], Awaitable[PolicyDecision]]
"""``async (spec, call, ctx) -> PolicyDecision``, awaited before a known tool's handler runs."""


class PolicyInput(NamedTuple):
    """Everything ``evaluate_policy`` looks at (an immutable record; change it with
    ``_replace``).

    Attributes:
        spec: the tool called.
        ctx: who calls it (``ctx.user_id`` is the user the limits and opt-ins belong to).
        raw_input: the call's arguments as received (normally a dict; anything is accepted).
        user_settings: the user's opt-ins and rate-limit overrides.
        recent_invocations: timestamps (UTC-aware) of the user's recent calls of this tool
            that took a rate-limit slot; ``None`` when they were not counted (the rate rule is
            then skipped: the caller counts and reserves separately).
        mode: ``off`` | ``log-only`` | ``enforce``.
        now: the time the rate limit is judged at (UTC-aware); the rate rule needs it with
            ``recent_invocations`` and is skipped without it.
        config: the consumer's configuration.
        destructive: what a destructive call without opt-in gets: ``deny`` (default) or
            ``ask`` (``DestructivePolicy``).
        approval: a person's decision on this call (``planner.approvals``; normally
            ``ctx.approval``), or ``None``.
    """

    spec: ToolSpec
    ctx: ToolContext
    raw_input: Any
    user_settings: UserPolicySettings
    recent_invocations: Sequence[datetime] | None
    mode: PolicyMode
    now: datetime | None = None
    config: PolicyConfig = PolicyConfig()
    destructive: DestructivePolicy = DestructivePolicy.DENY
    approval: Approval | None = None


def evaluate_policy(inp: PolicyInput) -> PolicyDecision:
    """Decide one call (see the module docstring for the rules and their order).

    Pure and total: never raises for any ``raw_input`` (not an object, huge, deeply nested,
    lone surrogates); the time it takes is bounded by the config's scan limits.
    """
    if inp.mode == "off":
        return _OFF_DECISION
    markers, truncated, not_object = find_injection_markers(
        inp.raw_input,
        inp.config.injection_markers,
        max_chars=inp.config.max_inspected_chars,
        max_nodes=inp.config.max_inspected_nodes,
    )
    return decide_scanned(inp, markers, truncated, not_object)


def decide_scanned(
    inp: PolicyInput, markers: tuple[str, ...], truncated: bool, not_object: bool
) -> PolicyDecision:
    """``evaluate_policy(inp)`` for a mode other than ``off`` whose arguments were scanned
    already: ``(markers, truncated, not_object)`` is what ``find_injection_markers`` gave for
    ``inp.raw_input`` with ``inp.config``'s markers and limits (a caller that scanned them
    for its own reasons, the gate, does not scan twice)."""
    flags: tuple[str, ...] = ()
    if markers or truncated or not_object:
        flags = tuple(
            flag
            for flag, on in (
                (INJECTION_MARKER, bool(markers)),
                (INSPECTION_TRUNCATED, truncated),
                (ARGUMENTS_NOT_OBJECT, not_object),
            )
            if on
        )
    denial = _first_denial(inp)
    if denial is None:
        approval = inp.approval
        if approval is not None and approval.granted and _needs_opt_in(inp):
            return PolicyDecision(
                allow=True,
                reason=APPROVED,
                verdict=PolicyVerdict.ALLOW,
                mode=inp.mode,
                message=f"{inp.spec.name} was {approval.describe()}",
                flags=flags,
                markers=markers,
            )
        if not flags and inp.mode == "enforce":
            return _ALLOWED_ENFORCE
        if not flags:
            return _ALLOWED_LOG_ONLY
        return PolicyDecision(
            allow=True,
            reason=ALLOWED,
            verdict=PolicyVerdict.ALLOW,
            mode=inp.mode,
            flags=flags,
            markers=markers,
        )
    reason, message, reminder = denial
    ask = reason == APPROVAL_REQUIRED
    return PolicyDecision(
        allow=inp.mode != "enforce",
        reason=reason,
        verdict=PolicyVerdict.ASK if ask else PolicyVerdict.DENY,
        mode=inp.mode,
        message=message,
        reminder=reminder if inp.mode == "enforce" and not ask else None,
        flags=flags,
        markers=markers,
    )


_OFF_DECISION = PolicyDecision(
    allow=True, reason=POLICY_OFF, verdict=PolicyVerdict.ALLOW, mode=PolicyMode.OFF
)
_ALLOWED_ENFORCE = PolicyDecision(
    allow=True, reason=ALLOWED, verdict=PolicyVerdict.ALLOW, mode=PolicyMode.ENFORCE
)
_ALLOWED_LOG_ONLY = PolicyDecision(
    allow=True, reason=ALLOWED, verdict=PolicyVerdict.ALLOW, mode=PolicyMode.LOG_ONLY
)


def _first_denial(inp: PolicyInput) -> tuple[str, str, str] | None:
    """(reason, message, reminder) of the first rule that denies, or ``None``."""
    spec, config = inp.spec, inp.config
    if config.exposed_scopes is not None and spec.scope not in config.exposed_scopes:
        exposed = ", ".join(sorted(config.exposed_scopes)) or "(none)"
        return (
            SCOPE_NOT_EXPOSED,
            f"{spec.name} is in scope {spec.scope!r}, which is not exposed here "
            f"(exposed scopes: {exposed})",
            f"{spec.name} is not available here; do not call it again.",
        )
    if _needs_opt_in(inp):
        approval = inp.approval
        if approval is not None and approval.decided:
            if not approval.matches_arguments(spec.name, inp.raw_input):
                return (
                    APPROVAL_MISMATCH,
                    f"{spec.name} differs from the call a person reviewed ({approval.describe()}: "
                    "another tool or other arguments); it was not run",
                    f"{spec.name} was not run: it is not the call that was approved. Do not "
                    "retry it.",
                )
            if not approval.granted:
                return approval.refusal()
        elif inp.destructive == DestructivePolicy.ASK:
            return (
                APPROVAL_REQUIRED,
                f"{spec.name} is destructive and user {inp.ctx.user_id!r} has not opted in to it "
                f"(nor to its scope {spec.scope!r}): a person must approve this call",
                "",
            )
        else:
            return (
                DESTRUCTIVE_NOT_OPTED_IN,
                f"{spec.name} is destructive and user {inp.ctx.user_id!r} has not opted in to it "
                f"(nor to its scope {spec.scope!r})",
                f"{spec.name} needs the user's opt-in; do not retry it. Go on without it, or say "
                "in your answer what you would have done.",
            )
    if inp.recent_invocations is not None and inp.now is not None:
        limit = config.rate_limit_for(spec.name, inp.user_settings)
        wait = rate_limit_wait(inp.recent_invocations, limit, inp.now)
        if wait is not None:
            return (
                RATE_LIMITED,
                f"rate limit reached: user {inp.ctx.user_id!r} may call {spec.name} "
                f"{limit.describe()}; the next slot frees in {_ceil_s(wait)} s",
                f"{spec.name} is rate-limited ({limit.describe()}); do not call it again "
                "right away: work with what you have.",
            )
    return None


def _needs_opt_in(inp: PolicyInput) -> bool:
    """A destructive call of a user who has not opted in to it (nor to its scope)."""
    return inp.spec.policy_hint == "destructive" and not inp.user_settings.opted_in(inp.spec)


def rate_limit_wait(
    recent: Sequence[datetime], limit: RateLimit, now: datetime
) -> timedelta | None:
    """How long until a slot frees, or ``None`` when a call may take one now.

    A call may run when fewer than ``limit.calls`` of ``recent`` lie in the rolling window
    ``(now - limit.window, now]``. The PostgreSQL ledger applies the same predicate when it
    reserves (``worker/queries/user_policy.py``), so the two always agree.
    """
    start = now - limit.window
    in_window = sorted((t for t in recent if t > start), reverse=True)
    if len(in_window) < limit.calls:
        return None
    return in_window[limit.calls - 1] + limit.window - now


def _ceil_s(delta: timedelta) -> int:
    seconds = delta.total_seconds()
    return max(1, int(seconds) + (0 if seconds == int(seconds) else 1))
