"""A mission run's policy gate: the gate of its ``PolicySetup`` (``worker.policy_setup``), with
what only a run has: its lease (an unreachable ledger is retried while the lease holds, then
interrupts the run: ``LeaseBoundLedger``) and its journal (a write's rate-limit reservation goes
in the statement that records its start: ``MissionGate``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from planner import RunInterrupted, ToolCall, ToolContext, ToolSpec
from planner.gate import CallLedger, Reservation, RulePolicyGate
from planner.policy import PolicyDecision, RateLimit
from worker.db.transient import describe_error, is_transient
from worker.run.leases import HeldLease

if TYPE_CHECKING:
    from worker.run.journal import MissionJournal

__all__ = ["LeaseBoundLedger", "MissionGate"]

logger = logging.getLogger(__name__)


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
        """See ``planner.gate.CallLedger.reserve``.

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
                decision=decision,
            )
            decision = gate.counted(inp, decision, reservation)
        gate.report(spec, call, ctx, decision)
        return decision
