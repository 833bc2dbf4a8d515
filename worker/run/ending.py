"""The one place a run's end is stored: ``EndWriter.write`` takes what the run came to (an
``Ending``: one ``worker.store.records.RunEnd`` and what it needs besides) and stores it with
``MissionStore.end_run``:

* transient database failures are retried while the lease holds (an interruption by a stop,
  at most ``SHUTDOWN_STORE_S``); past that the run is left to a takeover, which resumes it
  from its last checkpoint;
* data the database refuses is stored in turn with less of it (``outcomes.degraded``): a
  finished run as ``failed`` / ``store_failed``, a park the database refused as that failure,
  never retried for ever;
* while it stores, the run's task is marked (``storing``): a stop waits for a statement sent
  rather than cancel it (``worker.daemon.worker.Worker.drain``);
* a ``ClaimOrder`` rides on the first statement only (a retry or a degraded end claims
  nothing: a claim whose answer was lost must not be made twice);
* then what follows a stored end: the calls counted, the log line, a new approval request's
  webhook.

``RunOutcome`` says how it went (the ``outcome`` label of ``mana_ai_missions_run_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from planner import PlannerLoopResult
from worker import metrics
from worker.db.transient import describe_error, is_transient, retry_transient
from worker.policy_setup import PolicySetup
from worker.run.leases import HeldLease
from worker.run.outcomes import degraded, notice_fields
from worker.run.run_metrics import count_calls
from worker.store.base import MissionStore
from worker.store.records import (
    ClaimedMission,
    ClaimOrder,
    EndResult,
    Finished,
    Interrupted,
    NoRun,
    Parked,
    RunEnd,
)

__all__ = ["SHUTDOWN_STORE_S", "EndWriter", "Ending", "RunOutcome", "RunResult"]

logger = logging.getLogger(__name__)

SHUTDOWN_STORE_S = 5.0
"""Seconds a run interrupted by shutdown keeps trying to store its interruption; past it the
mission is left to whoever claims it once its lease expires (the takeover resumes it)."""


class RunOutcome(StrEnum):
    """How a run went (the ``outcome`` label of ``mana_ai_missions_run_total``):
    ``succeeded`` / ``failed`` (stored as such), ``interrupted`` (stored to resume later, or
    left to the lease's expiry), ``lease_lost`` (another worker holds it; nothing written),
    ``skipped`` (no run: missed, past its deadline, or its scheduled run finished already),
    ``awaiting_approval`` (parked until a person decides on a call); ``error`` (the run
    raised: only ``Worker.run_once`` reports it)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    LEASE_LOST = "lease_lost"
    SKIPPED = "skipped"
    AWAITING_APPROVAL = "awaiting_approval"
    ERROR = "error"


@dataclass(frozen=True)
class RunResult:
    """What ``MissionRunner.run`` did: its ``outcome``, and the missions its finish claimed
    for this worker (``claimed``; start them)."""

    outcome: RunOutcome
    claimed: tuple[ClaimedMission, ...] = ()


@dataclass(frozen=True)
class Ending:
    """What a run came to: the ``end`` to store, and ``instead`` what to store when the
    database refuses it (a park's: the run as a failure that says so); the loop's ``result``
    (its calls are counted once stored) and the names of the tools the run offered
    (``tool_names``, metric labels); ``shutdown``: an interruption by a stop (stored within
    ``SHUTDOWN_STORE_S``)."""

    end: RunEnd
    instead: Finished | None = None
    result: PlannerLoopResult | None = None
    tool_names: frozenset[str] = frozenset()
    shutdown: bool = False


class EndWriter:
    """Stores runs' ends for one worker (see the module docstring).

    Args:
        store: the database seam.
        worker_id: the lease owner.
        policy: the gate's setup (its webhook tells of new approval requests); ``None``: off.
    """

    def __init__(self, store: MissionStore, worker_id: str, policy: PolicySetup | None) -> None:
        self.store = store
        self.worker_id = worker_id
        self.policy = policy
        self.storing: set[asyncio.Future[Any]] = set()

    @contextlib.contextmanager
    def marked(self) -> Iterator[None]:
        """While the current task stores its end, it is in ``storing``: a stop does not
        cancel it then, since a statement sent commits whether or not its answer is awaited."""
        task = asyncio.current_task()
        if task is not None:
            self.storing.add(task)
        try:
            yield
        finally:
            if task is not None:
                self.storing.discard(task)

    async def write(
        self,
        mission: ClaimedMission,
        ending: Ending,
        lease: HeldLease,
        claim: ClaimOrder | None = None,
    ) -> RunResult:
        """Store ``ending`` (see the module docstring); how it went. Never raises but on
        cancellation."""
        lease.detach()  # from now on a lost lease means the end writes nothing
        with self.marked():
            stored = await self._stored(mission, ending, lease, claim)
        if stored is None:
            return RunResult(RunOutcome.INTERRUPTED)
        end, result = stored
        if not result.lease_held:
            metrics.LEASES_LOST.inc()
            logger.error("lease lost before the end of the run could be stored; dropped")
            return RunResult(RunOutcome.LEASE_LOST)
        if ending.result is not None:
            count_calls(ending.result.record, ending.tool_names)
        outcome = self._told(end, result)
        return RunResult(outcome, result.claimed)

    async def _stored(
        self, mission: ClaimedMission, ending: Ending, lease: HeldLease, claim: ClaimOrder | None
    ) -> tuple[RunEnd, EndResult] | None:
        """The end stored (the one first taken) and what storing it did; ``None``: left to a
        takeover (the database did not answer, or refused even the bare failure)."""
        within_s = SHUTDOWN_STORE_S if ending.shutdown else None
        refusal: Exception | None = None
        for end in _in_turn(ending):
            if refusal is not None:
                end = _with_refusal(end, refusal)
            order, claim = claim, None  # the first statement only
            try:
                result = await self._retried(
                    functools.partial(
                        self.store.end_run, mission, end, worker_id=self.worker_id, claim=order
                    ),
                    lease,
                    within_s,
                )
                return end, result
            except Exception as exc:
                if is_transient(exc) or isinstance(exc, TimeoutError):
                    logger.error(
                        "could not store the end of the run: the database did not answer "
                        "while the lease held (%s); the run is left to a takeover, which "
                        "resumes it from its last checkpoint",
                        describe_error(exc),
                    )
                    return None
                logger.exception("the database refused the end of the run; storing less of it")
                refusal = refusal or exc
        logger.error("the database refused even the bare failure; the run is left to a takeover")
        return None

    async def _retried(
        self,
        operation: Callable[[], Awaitable[EndResult]],
        lease: HeldLease,
        within_s: float | None,
    ) -> EndResult:
        """``operation`` retried on transient failures while the lease holds, and at most
        ``within_s`` seconds when given (each statement's wait included)."""
        if within_s is None:
            return await lease.retry(operation, what="storing the end of the run")
        deadline = min(lease.expires_at, time.monotonic() + within_s)
        async with asyncio.timeout(within_s):
            return await retry_transient(
                operation, deadline=deadline, what="storing the interruption"
            )

    def _told(self, end: RunEnd, result: EndResult) -> RunOutcome:
        """Log what was stored, tell the webhook of a new request; the run's outcome."""
        if isinstance(end, Parked):
            return self._parked(end, result)
        if isinstance(end, Interrupted):
            return RunOutcome.INTERRUPTED
        if isinstance(end, NoRun):
            return RunOutcome.SKIPPED
        outcome = end.outcome
        logger.info(
            "iteration %s: stop_reason=%s rounds=%d tokens=%d next_run_at=%s error=%s",
            outcome.status,
            outcome.stop_reason,
            outcome.rounds,
            outcome.prompt_tokens + outcome.completion_tokens,
            outcome.next_run_at.isoformat() if outcome.next_run_at else None,
            outcome.error,
        )
        return RunOutcome(outcome.status)

    def _parked(self, end: Parked, result: EndResult) -> RunOutcome:
        stored = result.parked
        assert stored is not None, "a park that held has its request"
        request = end.request
        logger.warning(
            "iteration parked after round %d: %s needs a person's approval (approval request "
            "%d, %s; expires %s): `mana-ai approvals approve %d` or `deny %d`",
            request.round,
            request.tool,
            stored.request_id,
            "new" if stored.created else "asked before",
            stored.expires_at.isoformat(),
            stored.request_id,
            stored.request_id,
        )
        if stored.created:
            metrics.APPROVAL_REQUESTS.labels(consumer="mission").inc()
            if self.policy is not None and self.policy.webhook is not None:
                self.policy.webhook.notify(
                    notice_fields(request, stored.request_id, expires_at=stored.expires_at)
                )
        return RunOutcome.AWAITING_APPROVAL


def _in_turn(ending: Ending) -> Iterator[RunEnd]:
    """The end, then what to store in its place, in turn, when the database refuses it: a
    finished run's degraded outcomes (``outcomes.degraded``); for a park, ``instead`` and its
    degraded outcomes; nothing for an interruption or no run (left to a takeover)."""
    yield ending.end
    failed = ending.end if isinstance(ending.end, Finished) else ending.instead
    if failed is None:
        return
    if failed is not ending.end:
        yield failed
    for outcome in degraded(failed.outcome):
        yield dataclasses.replace(failed, outcome=outcome)


def _with_refusal(end: RunEnd, refusal: Exception) -> RunEnd:
    """A degraded ``end`` whose error says why the first was refused (the cause, not
    SQLAlchemy's dump of the statement and its parameters)."""
    if not isinstance(end, Finished):
        return end
    error = f"could not store the iteration: {describe_error(refusal)}"[:500]
    return dataclasses.replace(end, outcome=dataclasses.replace(end.outcome, error=error))
