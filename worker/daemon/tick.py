"""One tick: claim the due missions this worker has room for, and run them.

``Worker.tick()`` claims up to ``max_concurrent_missions - running`` missions and starts one
task per mission; the tasks outlive the tick, so a long mission never delays the next tick.
``Worker.run(interval_s)`` is the daemon's one tick trigger: a loop that ticks at start, then
whenever the interval has elapsed or ``wake()`` was called. Under it, while a backlog is due
(the last claim filled every slot it had), a run's finish claims the next missions for the
slot it frees in the same statement (the Worker is the runs' ``ClaimAhead``,
``worker.run.claim_ahead``), and a tick fills only what the finishes did not.
``Worker.run_once()`` is a tick that waits for its missions (``mana-ai tick --once``; its runs
never claim ahead). ``Worker.drain(grace)`` stops claiming,
waits up to ``grace`` for running missions, then cancels the rest (each records an
``interrupted`` iteration and releases its lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from worker import metrics
from worker.run.runner import BUDGET_WINDOW, MissionRunner, RunOutcome
from worker.store.base import ClaimedMission, ClaimOrder, MissionStore
from worker.store.transient import describe_error

__all__ = ["Worker"]

logger = logging.getLogger(__name__)

ANSWER_WAIT_S = 5.0
"""Seconds a stop waits for a statement already sent (a run's end being stored, a tick's
claim) before it gives up on its answer: as long as a cancelled run gets to store its
interruption (``worker.run.runner.SHUTDOWN_STORE_S``)."""


class Worker:
    """Claims and runs missions for one worker id.

    Args:
        store: the database seam.
        runner: runs one claimed mission.
        worker_id: the lease owner id (unique per replica).
        max_concurrent_missions: missions run at once at most (≥ 1).
        lease: how long a claim lasts before another worker may take the mission.
        health: updated after every tick (for /healthz); optional.
    """

    def __init__(
        self,
        *,
        store: MissionStore,
        runner: MissionRunner,
        worker_id: str,
        max_concurrent_missions: int,
        lease: timedelta,
        health: metrics.HealthState | None = None,
    ) -> None:
        if max_concurrent_missions < 1:
            raise ValueError(f"max_concurrent_missions must be >= 1, got {max_concurrent_missions}")
        self.store = store
        self.runner = runner
        self.worker_id = worker_id
        self.max_concurrent_missions = max_concurrent_missions
        self.lease = lease
        self.health = health
        self.running: set[asyncio.Task[RunOutcome]] = set()
        self.stopping = False
        # tick() is public (run, run_once, tests): drain waits on this for a tick in flight
        self._tick_lock = asyncio.Lock()
        self._failed_ticks = 0
        self._wake = asyncio.Event()
        self._backlog = False  # the last claim filled every free slot: more may be due
        self._ahead = False  # finishes claim ahead (only under ``run``: run_once waits for its own)
        self._ordered = 0  # slots held by finishes' claims in flight
        self._claiming = 0  # slots held by the tick's claim in flight
        self._handing: set[asyncio.Task[Any]] = set()  # runs whose slot went to their claim
        self._begun: set[asyncio.Future[Any]] = set()  # runs that took their first step

    async def tick(self) -> list[asyncio.Task[RunOutcome]]:
        """Claim due missions into free slots and start them; return the started tasks.

        Raises whatever the database raises on claim (the caller logs it and ticks again).
        """
        async with self._tick_lock:
            if self.stopping:
                return []
            started = time.perf_counter()
            free = self._free()
            if free < 1:  # the finishes' claims filled the slots: the backlog stands
                return []
            self._claiming = free  # held while the claim is under way, as a finish's are
            try:
                claimed = await self.store.claim_due(
                    worker_id=self.worker_id,
                    limit=free,
                    lease=self.lease,
                    default_model=self.runner.default_model,
                    budget_window=BUDGET_WINDOW,
                )
            finally:
                self._claiming = 0
            self._backlog = len(claimed) == free
            tasks = [self._start(m) for m in claimed]
            metrics.MISSIONS_CLAIMED.inc(len(claimed))
            metrics.TICK_DURATION.observe(time.perf_counter() - started)
            if claimed:
                logger.info("tick claimed %d mission(s): %s", len(claimed), [m.id for m in claimed])
            return tasks

    async def tick_safely(self) -> None:
        """``tick()`` that logs and counts a failure instead of raising (what ``run`` calls).

        The first failure of a streak is logged with its traceback, the next ones as one line
        each (a database outage would otherwise flood the log), and the recovery once.
        """
        try:
            await self.tick()
        except Exception as exc:
            metrics.TICKS.labels(outcome="error").inc()
            database = isinstance(exc, SQLAlchemyError)
            # a database error says its root cause in one line (its str() holds the whole
            # statement: 18 KB for the claim); anything else keeps its traceback
            reason = describe_error(exc) if database else f"{type(exc).__name__}: {exc}".strip()
            if self.health:
                self.health.tick_failed(reason)
            self._failed_ticks += 1
            if self._failed_ticks == 1 and database:
                logger.error("tick failed (%s); retrying at every tick", reason)
            elif self._failed_ticks == 1:
                logger.exception("tick failed (%s); retrying at every tick", reason)
            else:
                logger.warning("tick failed again (%d in a row): %s", self._failed_ticks, reason)
        else:
            metrics.TICKS.labels(outcome="ok").inc()
            if self.health:
                self.health.tick_ok()
            if self._failed_ticks:
                logger.info("tick recovered after %d failed tick(s)", self._failed_ticks)
                self._failed_ticks = 0

    def order(self) -> ClaimOrder | None:
        """``ClaimAhead``: a finishing run's claim, for its own slot and the free ones, while
        the last claim filled every slot it had (``None`` otherwise, and under ``run_once``
        or once stopping). The slots stay held until ``settle``."""
        task = asyncio.current_task()
        if not (self._ahead and self._backlog) or self.stopping or task not in self.running:
            return None
        self._handing.add(task)  # its slot is the claim's from now on
        limit = self._free()
        if limit < 1:
            self._handing.discard(task)
            return None
        self._ordered += limit
        return ClaimOrder(
            limit=limit,
            lease=self.lease,
            default_model=self.runner.default_model,
            budget_window=BUDGET_WINDOW,
        )

    def settle(self, order: ClaimOrder, *, made: bool) -> None:
        """``ClaimAhead``: start what a finish claimed, and free its order's slots."""
        self._ordered -= order.limit
        if not made:  # the run keeps its slot while it goes on storing its end
            self._handing.discard(asyncio.current_task())
            return
        self._backlog = len(order.claimed) == order.limit
        if order.claimed:
            metrics.MISSIONS_CLAIMED.inc(len(order.claimed))
            logger.info(
                "a finish claimed %d mission(s): %s",
                len(order.claimed),
                [m.id for m in order.claimed],
            )
        for mission in order.claimed:
            self._start(mission)
        # a tick for the slots left: freed while the claim was under way, or, when it came
        # back short, for the run's own mission (its next run may be due already: the claim
        # could not take it)
        if self._free() > 0:
            self.wake()

    def _free(self) -> int:
        """Slots neither running (runs that handed theirs to a claim aside) nor held by a
        claim in flight (finishes' and the tick's)."""
        held = self._ordered + self._claiming
        return self.max_concurrent_missions - len(self.running) + len(self._handing) - held

    def wake(self) -> None:
        """Ask for a tick as soon as possible: a mission became due now (a NOTIFY from the
        database), or a slot freed while due missions may be waiting. Wake-ups coalesce: many
        before the tick runs give one tick. ``run`` acts on them; without it they wait."""
        if not self.stopping:
            self._wake.set()

    def stop(self) -> None:
        """Stop claiming: ``tick()`` claims nothing from now on and ``run`` returns once the
        tick in flight, if any, is done. Idempotent; running missions go on (``drain``)."""
        self.stopping = True
        self._wake.set()  # run's wait ends now, not at the next interval

    async def run(self, interval_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Tick (``tick_safely``) at once, then each time ``interval_s`` seconds have passed
        since the last tick began or ``wake()`` was called, whichever comes first, until
        ``stop()`` (or ``drain()``): the daemon's only tick trigger.

        One tick at a time: a tick slower than the interval is followed at once by one more,
        never overlapped, and the intervals it missed collapse into that one. Wake-ups
        coalesce: any number before a tick begins are answered by it, and any during a tick
        by one more right after it (that tick may have claimed before the mission it announces
        was committed). A wake-up tick restarts the interval, so the interval is the longest
        wait between two ticks, which ``/healthz`` relies on (stale after 3 intervals + 30 s).

        Args:
            interval_s: seconds (> 0); ``MANA_AI_TICK_INTERVAL_S`` in the daemon.
            clock: monotonic seconds, read at each tick's start and end (tests move it on).

        Raises:
            ValueError: ``interval_s`` is not positive.
        """
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._ahead = True
        try:
            await self._tick_until_stopped(interval_s, clock)
        finally:
            self._ahead = False

    async def _tick_until_stopped(self, interval_s: float, clock: Callable[[], float]) -> None:
        while not self.stopping:
            self._wake.clear()  # the wake-ups so far are answered by this tick
            begun = clock()
            await self.tick_safely()
            remaining = begun + interval_s - clock()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._wake.wait()

    async def run_once(self) -> list[RunOutcome]:
        """One tick, then wait for the missions it started; their outcomes in claim order.

        A run that raised (the database went away mid-run) counts as ``error``; its lease
        expires and another tick runs it again.
        """
        tasks = await self.tick()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [r if isinstance(r, RunOutcome) else RunOutcome.ERROR for r in results]

    async def drain(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Stop claiming; wait up to ``grace_s`` seconds (or until ``hurry`` is set), then
        cancel what still runs and wait for the cancelled runs to record their interruption.
        A run storing its end when its turn comes (``MissionRunner.storing``) is not cancelled
        for ``ANSWER_WAIT_S`` more: its statement commits anyway, and what it stored, and the
        missions its finish claimed, are then known. Missions a finish claimed as the stop
        came are waited for and interrupted alike, and so are those of a tick in flight: its
        claim is waited for within the grace, and at least ``ANSWER_WAIT_S`` (a database that
        does not answer it leaves them to their lease; the caller then cancels the tick
        loop). A cancelled run gets up to ``SHUTDOWN_STORE_S`` to store its interruption."""
        self.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        try:  # a tick in flight finishes starting its missions
            async with asyncio.timeout(max(grace_s, ANSWER_WAIT_S)):
                await self._tick_lock.acquire()
            self._tick_lock.release()
        except TimeoutError:
            logger.warning("the tick in flight got no answer from the database; not waiting")
        pending = set(self.running)
        if not pending:
            return
        logger.info("waiting up to %.1f s for %d running mission(s)", grace_s, len(pending))
        hurried = asyncio.create_task(hurry.wait()) if hurry is not None else None
        still: set[asyncio.Future[Any]] = set(pending)
        try:
            while still and (remaining := deadline - loop.time()) > 0:
                waiting = still | {hurried} if hurried is not None else still
                done, _ = await asyncio.wait(
                    waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if hurried is not None and hurried in done:
                    logger.warning("asked again to stop: interrupting now")
                    break
                still -= done
                still |= self._unfinished()  # started by a finish's claim made before the stop
        finally:
            if hurried is not None:
                hurried.cancel()
        while still := self._unfinished():
            # a run cancelled before its first step cannot record its interruption: one a
            # finish's claim started just now begins first (its step is queued before ours)
            while not still <= self._begun:
                await asyncio.sleep(0)
                still = self._unfinished()
            storing = still & self.runner.storing
            for task in still - storing:
                task.cancel()
            logger.warning("interrupting %d mission(s)", len(still))
            if storing:  # not cut off while it stores its end: it commits anyway
                await asyncio.wait(storing, timeout=ANSWER_WAIT_S)
                for task in storing & self.runner.storing:
                    task.cancel()  # no answer: the database is gone
            await asyncio.gather(*still, return_exceptions=True)

    def _unfinished(self) -> set[asyncio.Future[Any]]:
        return {task for task in self.running if not task.done()}

    def _start(self, mission: ClaimedMission) -> asyncio.Task[RunOutcome]:
        task = asyncio.create_task(self._run(mission), name=f"mission-{mission.id}")
        self.running.add(task)
        metrics.MISSIONS_RUNNING.set(len(self.running))
        task.add_done_callback(functools.partial(self._finished, mission.id))
        return task

    async def _run(self, mission: ClaimedMission) -> RunOutcome:
        self._begun.add(asyncio.current_task())  # type: ignore[arg-type]
        return await self.runner.run(mission, ahead=self)

    def _finished(self, mission_id: int, task: asyncio.Task[RunOutcome]) -> None:
        self.running.discard(task)
        self._begun.discard(task)
        self._handing.discard(task)
        metrics.MISSIONS_RUNNING.set(len(self.running))
        if self._backlog and not self._ordered and self._free() > 0:
            self.wake()  # the last claim left due missions behind (a claim under way: it wakes)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "mission run failed before its iteration was stored; another tick reruns it "
                "once its lease expires",
                exc_info=task.exception(),
                extra={"mission_id": mission_id},
            )
