"""The policy gate every consumer of the tools uses: ``RulePolicyGate`` applies the rules
(``planner.policy.evaluate_policy``) and takes rate-limit slots from a ``CallLedger``, so that
counting and reserving a slot are one atomic step across every process sharing the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple, Protocol

from planner.errors import RunInterrupted
from planner.markers import CompiledMarkers, compile_markers, scan_for_markers
from planner.messages import ToolCall
from planner.policy import (
    POLICY_UNAVAILABLE,
    DestructivePolicy,
    PolicyConfig,
    PolicyDecision,
    PolicyInput,
    PolicyMode,
    PolicyVerdict,
    RateLimit,
    UserPolicySettings,
    decide_scanned,
    evaluate_policy,
)
from planner.tools import ToolContext, ToolSpec

__all__ = ["CallLedger", "DecisionObserver", "Reservation", "RulePolicyGate"]

logger = logging.getLogger(__name__)


class Reservation(NamedTuple):
    """What a ``CallLedger`` answered (an immutable record).

    Attributes:
        reserved: a slot was taken (fewer than ``limit.calls`` calls were in the window).
        now: the ledger's clock when it counted (UTC-aware); the slot is stamped with it.
        recent: when refused, the timestamps in the window (at most ``limit.calls``, in any
            order), from which the rules tell when a slot frees; may be empty when reserved.
    """

    reserved: bool
    now: datetime
    recent: tuple[datetime, ...]


class CallLedger(Protocol):
    """Counts and reserves rate-limit slots, atomically across every process sharing it."""

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        """Count ``user_id``'s calls of ``tool`` in ``(now - limit.window, now]`` and, when
        there are fewer than ``limit.calls``, record one at ``now`` — as one atomic step, so
        two callers can never both take the last slot.

        Raises:
            Exception: the ledger is unavailable (the gate then fails closed in ``enforce``
                and open in ``log-only``).
        """
        ...


class _Decided(NamedTuple):
    """A decision of the rules and everything it was decided on (``RulePolicyGate._known``)."""

    spec: ToolSpec
    user_id: str
    mode: PolicyMode
    config: PolicyConfig
    user_settings: UserPolicySettings
    destructive: DestructivePolicy
    decision: PolicyDecision


DecisionObserver = Callable[[ToolSpec, ToolCall, ToolContext, PolicyDecision], None]
"""Called with every decision a gate takes (metrics, logs). Must not raise."""


class RulePolicyGate:
    """The ``PolicyGate`` every consumer uses: ``evaluate_policy`` plus a ``CallLedger``.

    Build one per iteration (or per request): the user's settings are read once, by the
    caller. For each call it evaluates the rules that need no counting; when they allow the
    call (whatever the mode), it reserves a rate-limit slot in the ledger, and a call the
    ledger refuses is decided again with the ledger's timestamps (``rate_limited``). Calls the
    rules deny never take a slot — in ``log-only`` either, so that log-only records exactly
    what ``enforce`` would do.

    A destructive call the user has not opted in to is denied, or with ``destructive="ask"``
    asked about (verdict ``ask``; no slot is taken until a person approved it). A call whose
    ``ctx.approval`` is a granted approval of exactly this call passes that rule (reason
    ``approved``) and takes its slot like any other.

    When the ledger fails, the gate fails closed in ``enforce`` (denied,
    ``policy_unavailable``) and open in ``log-only`` (allowed, with a ``policy_unavailable``
    would-be denial), and logs a warning. A ledger that raises ``RunInterrupted`` (a mission's
    ledger, once its database stayed unreachable) stops the run in ``enforce`` instead: the
    model is never told to try again for a fault that is not its own. Nothing else raises out
    of the gate.

    Args:
        mode: ``log-only`` or ``enforce`` (use no gate at all for ``off``).
        config: the consumer's configuration.
        user_settings: the settings of the user the calls run for.
        ledger: where rate-limit slots are counted and taken.
        consumer: who calls (``mission``, ``mcp``), recorded with each slot.
        observe: called with every decision (metrics, logs).
        destructive: what a destructive call without the user's opt-in gets: ``deny``
            (default) or ``ask`` (``planner.policy.DestructivePolicy``).
    """

    def __init__(
        self,
        *,
        mode: PolicyMode,
        config: PolicyConfig,
        user_settings: UserPolicySettings,
        ledger: CallLedger,
        consumer: str = "mission",
        observe: DecisionObserver | None = None,
        destructive: DestructivePolicy = DestructivePolicy.DENY,
    ) -> None:
        self.mode: PolicyMode = mode
        self.config = config
        self.user_settings = user_settings
        self.ledger = ledger
        self.consumer = consumer
        self.observe = observe
        self.destructive = destructive
        self._limits: dict[str, RateLimit] = {}
        # per tool name: the rules' decision on a call of it with unflagged arguments and no
        # approval (see ``_known``), with what it was decided on
        self._decided: dict[str, _Decided] = {}
        self._compiled: tuple[tuple[str, ...], CompiledMarkers] | None = None

    async def __call__(self, spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        """Decide ``call`` (see the class docstring); never raises except on cancellation and
        ``RunInterrupted`` from the ledger in ``enforce``."""
        inp: PolicyInput | None = None
        decision = self._known(spec, call, ctx)
        if decision is None:
            inp, decision = self.rules(spec, call, ctx)
        if decision.verdict == "allow" and self.mode != "off":
            # The rules that need no counting allow the call: take a rate-limit slot.
            limit = self._limits.get(spec.name) or self.limit_for(spec)
            try:
                reservation = await self.ledger.reserve(
                    user_id=ctx.user_id, tool=spec.name, limit=limit, consumer=self.consumer
                )
            except RunInterrupted:
                if self.mode == "enforce":
                    raise  # the run stops and resumes; the model is not told "try later"
                inp = inp or self._input(spec, call, ctx)
                decision = self._unavailable(inp, decision, "its rate-limit store is unreachable")
                logger.warning("policy gate unavailable for %s: allowing it (log-only)", spec.name)
            except Exception as exc:
                logger.warning(
                    "policy gate unavailable for %s (%s: %s): %s",
                    spec.name,
                    type(exc).__name__,
                    exc,
                    "denying the call (enforce)"
                    if self.mode == "enforce"
                    else "allowing it (log-only)",
                )
                # the model reads the message, not the exception (which may quote SQL or
                # addresses); the log above has the details
                inp = inp or self._input(spec, call, ctx)
                decision = self._unavailable(inp, decision, "its rate-limit store did not answer")
            else:
                if not reservation.reserved:
                    decision = self._refused(
                        inp or self._input(spec, call, ctx), decision, reservation
                    )
        if self.observe is not None:
            self.report(spec, call, ctx, decision)
        return decision

    def _known(self, spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision | None:
        """The rules' decision without running them all, when it is provably the one they
        gave before, else ``None`` (the caller runs ``rules``).

        ``evaluate_policy`` is pure; for a call without an approval, and with the rate rule
        left to the ledger, its decision depends on the arguments only through the marker
        scan's flags. So a call whose arguments raise no flag gets the decision of the first
        such call of its tool, as long as everything else it depended on is the same: the
        same ``ToolSpec`` object (frozen), the same user, and the gate's ``mode``, ``config``,
        ``user_settings`` and ``destructive`` unchanged (the same objects; both settings are
        frozen). The arguments are scanned every time."""
        if ctx.approval is not None or self.mode == "off":
            return None
        config = self.config
        markers = config.injection_markers
        compiled = self._compiled
        if compiled is None or compiled[0] is not markers:
            compiled = self._compiled = (markers, compile_markers(markers))
        try:
            found, truncated, not_object = scan_for_markers(
                call.arguments,
                compiled[1],
                max_chars=config.max_inspected_chars,
                max_nodes=config.max_inspected_nodes,
            )
        except Exception:  # never expected; the full rules decide (and report a bug)
            return None
        if found or truncated or not_object:
            return None  # a flagged call: the full rules make its decision
        known = self._decided.get(spec.name)
        if (
            known is not None
            and known.spec is spec
            and known.user_id == ctx.user_id
            and known.mode is self.mode
            and known.config is config
            and known.user_settings is self.user_settings
            and known.destructive is self.destructive
        ):
            return known.decision
        basis = (self.mode, config, self.user_settings, self.destructive)
        try:  # the rules, on the scan just made (found nothing)
            decision = decide_scanned(self._input(spec, call, ctx), (), False, False)
        except Exception:  # a bug in the rules: ``rules`` reports it
            return None
        self._decided[spec.name] = _Decided(spec, ctx.user_id, *basis, decision)
        return decision

    def _input(self, spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyInput:
        """What the rules look at for ``call`` (the rate rule left to the ledger)."""
        return PolicyInput(
            spec,
            ctx,
            call.arguments,
            self.user_settings,
            None,
            self.mode,
            None,
            self.config,
            self.destructive,
            ctx.approval,
        )

    def rules(
        self, spec: ToolSpec, call: ToolCall, ctx: ToolContext
    ) -> tuple[PolicyInput, PolicyDecision]:
        """The input and the decision of the rules that need no counting (a bug in the rules
        gives a ``policy_unavailable`` decision, never an exception). A caller that counts the
        call elsewhere (in the same round trip as another write) goes on with ``limit_for``,
        ``counted`` and ``report``."""
        inp = self._input(spec, call, ctx)
        try:
            return inp, evaluate_policy(inp)
        except Exception:  # a bug in the rules must not crash the loop
            logger.exception("policy rules failed for %s", spec.name)
            return inp, self._unavailable(inp, None, "its rules failed")

    def limit_for(self, spec: ToolSpec) -> RateLimit:
        """The rate limit that applies to ``spec`` for this gate's user (worked out once per
        tool: the gate's configuration and user settings do not change)."""
        limit = self._limits.get(spec.name)
        if limit is None:
            limit = self._limits[spec.name] = self.config.rate_limit_for(
                spec.name, self.user_settings
            )
        return limit

    def counted(
        self, inp: PolicyInput, decision: PolicyDecision, reservation: Reservation
    ) -> PolicyDecision:
        """``decision`` (the rules' allow) once the ledger answered: unchanged when a slot
        was taken, else what the rules say given the ledger's timestamps (``rate_limited``)."""
        if reservation.reserved:
            return decision
        return self._refused(inp, decision, reservation)

    def report(
        self, spec: ToolSpec, call: ToolCall, ctx: ToolContext, decision: PolicyDecision
    ) -> None:
        """Give ``decision`` to the observer (metrics, logs); what it raises is logged."""
        if self.observe is not None:
            try:
                self.observe(spec, call, ctx, decision)
            except Exception:  # an observer must not change the decision
                logger.exception("policy decision observer failed")

    def _refused(
        self, inp: PolicyInput, allowed: PolicyDecision, reservation: Reservation
    ) -> PolicyDecision:
        """The ledger refused a slot: the rules, given its timestamps, say why."""
        counted = evaluate_policy(
            inp._replace(recent_invocations=reservation.recent, now=reservation.now)
        )
        if counted.verdict == "deny":
            return counted
        # The ledger refused, so the window is full; the rules must agree.
        logger.error("ledger refused %s but the rules allow it; denying", inp.spec.name)
        return self._unavailable(inp, allowed, "the rate-limit ledger and the rules disagree")

    def _unavailable(
        self, inp: PolicyInput, first: PolicyDecision | None, detail: str
    ) -> PolicyDecision:
        return PolicyDecision(
            allow=self.mode != "enforce",
            reason=POLICY_UNAVAILABLE,
            verdict=PolicyVerdict.DENY,
            mode=self.mode,
            message=f"the policy gate could not decide this call ({detail})",
            reminder=(
                f"{inp.spec.name} could not be checked by the policy gate just now; try "
                "again later or go on without it."
                if self.mode == "enforce"
                else None
            ),
            flags=first.flags if first is not None else (),
            markers=first.markers if first is not None else (),
        )
