"""The store seam: what the run, the tick, the journal and the gate need of the database, as a
protocol, and the rows that cross it.

Two implementations sit beside it: ``worker.store.postgres.PostgresMissionStore`` (PostgreSQL,
any number of replicas) and ``worker.store.memory.InMemoryMissionStore`` (one process, for unit
tests: the same semantics on dictionaries). The model is procrastinate's ``BaseConnector`` and
``InMemoryConnector``, and APScheduler 4's ``abc.py``: the seam's docstrings state what a lease
means, the units, and what is raised.

Leases (every replica follows them):

* ``claim_due`` picks due, unleased (or lease-expired) active missions, oldest ``next_run_at``
  first, and stamps ``lease_owner`` / ``lease_expires_at`` in the same step, so two workers
  never claim the same mission; it starts (or takes over) their iterations.
* Every later change (a checkpoint, a call's start, the finish, an interruption, renewal) is
  conditional on ``lease_owner`` still being the worker: a worker that lost its lease writes
  nothing. A finish, an interruption or a call's start repeated after a failure that left it
  unknown whether it was stored stores the same thing once (retries are safe).
* Lease times are the store's clock (the database's ``now()``), never a worker's, so replicas
  with skewed clocks agree on expiry.

Errors: a method raises what its backend raises when it fails (``sqlalchemy.exc.DBAPIError``
and ``OSError`` for PostgreSQL; ``worker.db.transient.is_transient`` tells the transient ones),
and ``LeaseLostError`` when a write finds the lease lost (the one way a method says so).
The values that cross the seam are in ``worker.store.records``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import timedelta
from typing import Any, Protocol

from planner import RunInterrupted
from planner.policy import RateLimit
from worker.store.records import (
    CallStart,
    ClaimedMission,
    ClaimOrder,
    EndResult,
    RoundCheckpoint,
    RunEnd,
    StartedIteration,
    ToolInvocationRow,
)

__all__ = ["LeaseLostError", "MissionStore"]


class LeaseLostError(RunInterrupted):
    """This worker no longer owns the mission's lease: it must not write or run anything (a
    run that meets it stops, and writes nothing more)."""


class MissionStore(Protocol):
    """What a worker needs of the database to run missions (see the module docstring).

    Times are UTC-aware ``datetime``; durations ``timedelta``. Ids are the store's own.
    """

    async def claim_due(
        self,
        *,
        worker_id: str,
        limit: int,
        lease: timedelta,
        default_model: str | None = None,
        budget_window: timedelta = timedelta(hours=24),
    ) -> list[ClaimedMission]:
        """Lease up to ``limit`` due missions for ``lease`` to ``worker_id`` and start their
        iterations, as one atomic step (``ClaimedMission`` says what comes with each).

        Due = active, ``next_run_at`` at or before now, no live lease, and no pending approval
        request that has not expired (a parked run waits for its decision) unless the deadline
        passed (then the mission is claimed to be completed, which ends the parked run). A
        mission whose scheduled run finished already, or lies past its deadline, comes without
        an iteration; a run parked for approval is taken over like an interrupted one. Returns
        ``[]`` when ``limit`` < 1; oldest ``scheduled_for`` first.

        Never repeated by the store when its answer is lost (the connection broke once it was
        sent): the error is raised, and what that step may have claimed waits for its lease
        to expire, as after a crash, where a repeat would claim more on top.
        """
        ...

    async def resume_details(self, iteration: StartedIteration) -> StartedIteration:
        """``iteration`` with what a takeover needs besides the checkpoint on its row (the
        last stored round's calls and the compactions so far); unchanged unless it is
        ``resumable``."""
        ...

    async def renew_leases(
        self, mission_ids: Collection[int], *, worker_id: str, lease: timedelta
    ) -> set[int]:
        """Push the leases of ``mission_ids`` that ``worker_id`` still owns ``lease`` past
        now, in one step; return those ids (the others were taken over: their runs must
        stop)."""
        ...

    async def record_call_start(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
        reserve: tuple[RateLimit, str, bool] | None = None,
    ) -> CallStart:
        """Before a write or destructive call runs: store ``checkpoint`` and ``rows`` (the
        last one the call's ``started`` row) under the lease, in one step; with ``reserve``
        = ``(limit, consumer, run_anyway)``, reserve the call's rate-limit slot first and
        store its ``started`` row only when one was taken or ``run_anyway``.

        Raises:
            LeaseLostError: ``worker_id`` no longer owns the mission (nothing was stored).
        """
        ...

    async def run_effect(
        self,
        mission: ClaimedMission,
        row_id: int,
        effect: Callable[[Any], Awaitable[Any]],
        *,
        worker_id: str,
    ) -> Any:
        """Run a call's ``effect`` (``ToolSpec.effect``: ``connection -> result``) and store
        the call's outcome, ``ok`` with the result, on its ``started`` row ``row_id``, in one
        transaction under the lease: both commit or neither does, so a call whose row still
        says ``started`` never took effect. The effect's result.

        Raises:
            LeaseLostError: ``worker_id`` no longer owns the mission, or the row is no longer
                this run's ``started`` one (a takeover made the call its own); nothing is
                committed.
            Whatever ``effect`` raises (nothing is committed; the call's error is stored
            with the run's next write).
        """
        ...

    async def commit_round(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
    ) -> dict[tuple[int, int], int]:
        """Store a round (``checkpoint`` and ``rows``) under the lease, in one step; the new
        rows' ids by ``(round, position)``.

        Raises:
            LeaseLostError: ``worker_id`` no longer owns the mission (nothing was stored).
        """
        ...

    async def end_run(
        self,
        mission: ClaimedMission,
        end: RunEnd,
        *,
        worker_id: str,
        claim: ClaimOrder | None = None,
    ) -> EndResult:
        """Store how a run ended, in one step that releases the lease:

        * ``Finished``: the iteration, its calls and compactions, and the mission's next run
          (a paused mission stays paused);
        * ``Interrupted``: the run ``failed`` / ``interrupted`` with its checkpoint, the
          schedule as it was (the next claim takes the same scheduled run over);
        * ``Parked``: the checkpoint and calls (the parked one's row ``parked``), the
          iteration ``awaiting_approval`` and the approval request (unless the call has one:
          a call is asked about once), the schedule as it was: until the request is decided
          or expires, ``claim_due`` leaves the mission alone; then the next claim takes the
          run over and ``resume_details`` gives it the decision;
        * ``NoRun``: the schedule moves on, and a run of the mission parked for an approval
          ends ``failed`` / ``deadline_passed`` (it is not resumed past the deadline).

        ``EndResult.lease_held`` is False (nothing stored) when ``worker_id`` no longer owns
        the mission; a repeat by the same attempt after an end it stored finds it, and holds.
        With ``claim`` (a ``Finished`` end only), the same step also claims other due
        missions for ``worker_id`` (``EndResult.claimed``), whether or not the lease held:
        the claim is the worker's, for the slot this run frees; such a step is never
        repeated by the store when its answer is lost (as ``claim_due``), where an end
        without a claim may be, once.

        Raises:
            The backend's errors (``worker.db.transient.is_transient`` tells the transient
            ones); ``ValueError`` for a ``claim`` with an end other than ``Finished``.
        """
        ...
