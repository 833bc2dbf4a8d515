"""The worker: claim the due missions this worker has room for, and run them.

``Worker.tick()`` claims up to ``max_concurrent_missions - running`` missions and starts one
task per mission; the tasks outlive the tick, so a long mission never delays the next tick.
In the daemon the tick is an APScheduler job (``Worker.schedule``): an interval job that
ticks at once and then every ``interval_s``; a wake-up (a mission became due now, a slot
freed while due missions wait) brings the job's next run forward, or, during a tick, has it
tick once more right after. While a backlog is due (the last claim filled every slot it
asked for), a run's finish claims the next mission for the slot it frees in the same
statement (``MissionRunner.run(claim_ahead=1)``: one round trip per mission instead of two);
the tick fills what the finishes did not.

``Worker.run_once()`` is a tick that waits for its missions (``mana-ai tick --once``; its runs
never claim ahead). ``Worker.drain(grace)`` stops claiming, waits up to ``grace`` for running
missions, then cancels the rest (each records an ``interrupted`` iteration and releases its
lease).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from worker import metrics
from worker.db.transient import describe_error
from worker.run.runner import BUDGET_WINDOW, MissionRunner, RunOutcome
from worker.store.base import MissionStore
from worker.store.records import ClaimedMission

__all__ = ["ANSWER_WAIT_S", "Worker"]

logger = logging.getLogger(__name__)

ANSWER_WAIT_S = 5.0
"""Seconds a stop waits for a statement already sent (a run's end being stored, a tick's
claim) before it gives up on its answer: as long as a cancelled run gets to store its
interruption (``worker.run.ending.SHUTDOWN_STORE_S``)."""


class Worker:
    """Claims and runs missions for one worker id.

    Args:
        store: the database seam.
        runner: runs one claimed mission.
        worker_id: the lease owner id (unique per replica).
        max_concurrent_missions: missions run at once at most (≥ 1).
        lease: how long a claim lasts before another worker may take the mission.
        health: updated after every tick (for /healthz); optional.

    Raises:
        ValueError: ``max_concurrent_missions`` < 1.
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
        self._tick_lock = asyncio.Lock()  # drain waits on it for a tick in flight
        self._failed_ticks = 0
        self._job: Any = None  # the APScheduler job that ticks (``schedule``)
        self._woken = False  # a wake-up came during a tick: one more right after it
        self._backlog = False  # the last claim filled every slot it asked for
        self._begun: set[asyncio.Future[Any]] = set()  # runs that took their first step

    async def tick(self) -> list[asyncio.Task[RunOutcome]]:
        """Claim due missions into free slots and start them; return the started tasks.

        Raises whatever the database raises on claim (the caller logs it and ticks again).
        """
        async with self._tick_lock:
            if self.stopping:
                return []
            started = time.perf_counter()
            free = self.max_concurrent_missions - len(self.running)
            if free < 1:
                return []
            claimed = await self.store.claim_due(
                worker_id=self.worker_id,
                limit=free,
                lease=self.lease,
                default_model=self.runner.default_model,
                budget_window=BUDGET_WINDOW,
            )
            self._backlog = len(claimed) == free
            tasks = [self._start(m) for m in claimed]
            metrics.MISSIONS_CLAIMED.inc(len(claimed))
            metrics.TICK_DURATION.observe(time.perf_counter() - started)
            if claimed:
                logger.info("tick claimed %d mission(s): %s", len(claimed), [m.id for m in claimed])
            return tasks

    async def tick_safely(self) -> None:
        """``tick()`` that logs and counts a failure instead of raising (the job's tick).

        The first failure of a streak is logged with its traceback, the next ones as one line
        each (a database outage would otherwise flood the log), and the recovery once.
        """
        try:
            await self.tick()
        except Exception as exc:
            metrics.TICKS.labels(outcome="error").inc()
            database = isinstance(exc, SQLAlchemyError)
            # a database error says its root cause in one line (its str() holds the whole
            # statement); anything else keeps its traceback
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

    def schedule(self, scheduler: Any, interval_s: float) -> None:
        """Tick as ``scheduler``'s interval job (APScheduler's ``AsyncIOScheduler``): at once,
        then every ``interval_s`` seconds (> 0) after the last tick began. One tick at a
        time: a job that fires during a tick has it tick once more right after it, so a tick
        slower than the interval is followed at once by one more, never overlapped, and the
        intervals it missed collapse into that one (``coalesce``). A wake-up brings the next
        tick forward (``wake``), which restarts the interval, so the interval is the longest
        wait between two ticks, which ``/healthz`` relies on (stale after 3 intervals + 30
        s). Finishes claim ahead from now on.

        Raises:
            ValueError: ``interval_s`` is not positive.
        """
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._job = scheduler.add_job(
            self._ticks,
            "interval",
            seconds=interval_s,
            id="tick",
            name="claim and start due missions",
            next_run_time=datetime.now(UTC),
            max_instances=2,  # the second only asks the first for one more tick
            coalesce=True,
            misfire_grace_time=None,
        )

    async def _ticks(self) -> None:
        """The job: a tick, and one more right after it for each wake-up or firing that came
        during it (that tick may have claimed before the mission a wake-up announces was
        committed)."""
        if self._tick_lock.locked():
            self._woken = True
            return
        while True:
            self._woken = False
            await self.tick_safely()
            if not self._woken or self.stopping:
                return

    def wake(self) -> None:
        """Ask for a tick as soon as possible: a mission became due now (a NOTIFY from the
        database), or a slot freed while due missions may be waiting. Wake-ups coalesce: many
        before the tick runs give one tick. Without a scheduled job they wait."""
        if self.stopping or self._job is None:
            return
        if self._tick_lock.locked():
            self._woken = True
            return
        self._job.modify(next_run_time=datetime.now(UTC))

    def stop(self) -> None:
        """Stop claiming: ``tick()`` claims nothing from now on. Idempotent; running missions
        go on (``drain``)."""
        self.stopping = True

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
        mission its finish claimed, are then known. Missions a finish claimed as the stop came
        are waited for and interrupted alike, and so are those of a tick in flight: its claim
        is waited for within the grace, and at least ``ANSWER_WAIT_S`` (a database that does
        not answer it leaves them to their lease). A cancelled run gets up to
        ``SHUTDOWN_STORE_S`` to store its interruption."""
        self.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        try:  # a tick in flight finishes starting its missions
            async with asyncio.timeout(max(grace_s, ANSWER_WAIT_S)):
                await self._tick_lock.acquire()
            self._tick_lock.release()
        except TimeoutError:
            logger.warning("the tick in flight got no answer from the database; not waiting")
        if self.running:
            logger.info(
                "waiting up to %.1f s for %d running mission(s)", grace_s, len(self.running)
            )
            await self._wait_for_runs(deadline, hurry)
        while still := self._unfinished():
            await self._interrupt(still)

    async def _wait_for_runs(self, deadline: float, hurry: asyncio.Event | None) -> None:
        """Wait until every run ended, ``deadline`` (the loop's time) passed or ``hurry`` was
        set; runs a finish's claim started meanwhile are waited for too."""
        loop = asyncio.get_running_loop()
        hurried = asyncio.create_task(hurry.wait()) if hurry is not None else None
        try:
            while (still := self._unfinished()) and (remaining := deadline - loop.time()) > 0:
                waiting = still | {hurried} if hurried is not None else still
                done, _ = await asyncio.wait(
                    waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if hurried is not None and hurried in done:
                    logger.warning("asked again to stop: interrupting now")
                    return
        finally:
            if hurried is not None:
                hurried.cancel()

    async def _interrupt(self, still: set[asyncio.Future[Any]]) -> None:
        """Cancel the runs ``still`` running (a run storing its end gets ``ANSWER_WAIT_S``
        first) and wait for them to store their interruption."""
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
        """Run ``mission``; while a backlog is due, its finish claims the mission that takes
        its slot, which is started at once."""
        self._begun.add(asyncio.current_task())  # type: ignore[arg-type]
        ahead = int(self._backlog and self._job is not None and not self.stopping)
        result = await self.runner.run(mission, claim_ahead=ahead)
        if ahead:
            self._backlog = bool(result.claimed)
        if result.claimed:
            metrics.MISSIONS_CLAIMED.inc(len(result.claimed))
            logger.info("a finish claimed mission(s): %s", [m.id for m in result.claimed])
            for claimed in result.claimed:
                self._start(claimed)
        elif ahead or self._backlog:
            # the slot frees (the tick runs once this run is done): for the backlog, or for
            # the run's own mission, whose next run may be due already (a finish's claim
            # cannot take it)
            self.wake()
        return result.outcome

    def _finished(self, mission_id: int, task: asyncio.Task[RunOutcome]) -> None:
        self.running.discard(task)
        self._begun.discard(task)
        metrics.MISSIONS_RUNNING.set(len(self.running))
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "mission run failed before its iteration was stored; another tick reruns it "
                "once its lease expires",
                exc_info=task.exception(),
                extra={"mission_id": mission_id},
            )
