"""One tick: claim the due missions this worker has room for, and run them.

``Worker.tick()`` claims up to ``max_concurrent_missions - running`` missions and starts one
task per mission; the tasks outlive the tick, so a long mission never delays the next tick.
``Worker.run_once()`` is a tick that waits for its missions (``mana-ai tick --once``).
``Worker.drain(grace)`` stops claiming, waits up to ``grace`` for running missions, then
cancels the rest (each records an ``interrupted`` iteration and releases its lease).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import timedelta
from typing import Any

from worker import metrics
from worker.db.base import ClaimedMission, MissionStore
from worker.runner import BUDGET_WINDOW, MissionRunner, RunOutcome

__all__ = ["Worker"]

logger = logging.getLogger(__name__)


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
        self._tick_lock = asyncio.Lock()
        self._failed_ticks = 0
        self._wake = asyncio.Event()
        self._backlog = False  # the last claim filled every free slot: more may be due

    async def tick(self) -> list[asyncio.Task[RunOutcome]]:
        """Claim due missions into free slots and start them; return the started tasks.

        Raises whatever the database raises on claim (the caller logs it and ticks again).
        """
        async with self._tick_lock:
            if self.stopping:
                return []
            started = time.perf_counter()
            free = self.max_concurrent_missions - len(self.running)
            claimed = await self.store.claim_due(
                worker_id=self.worker_id,
                limit=free,
                lease=self.lease,
                default_model=self.runner.default_model,
                budget_window=BUDGET_WINDOW,
            )
            self._backlog = free > 0 and len(claimed) == free
            tasks = [self._start(m) for m in claimed]
            metrics.MISSIONS_CLAIMED.inc(len(claimed))
            metrics.TICK_DURATION.observe(time.perf_counter() - started)
            if claimed:
                logger.info("tick claimed %d mission(s): %s", len(claimed), [m.id for m in claimed])
            return tasks

    async def tick_safely(self) -> None:
        """``tick()`` that logs and counts a failure instead of raising (the scheduler job).

        The first failure of a streak is logged with its traceback, the next ones as one line
        each (a database outage would otherwise flood the log), and the recovery once.
        """
        try:
            await self.tick()
        except Exception as exc:
            metrics.TICKS.labels(outcome="error").inc()
            reason = f"{type(exc).__name__}: {exc}".strip()
            if self.health:
                self.health.tick_failed(reason)
            self._failed_ticks += 1
            if self._failed_ticks == 1:
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

    def wake(self) -> None:
        """Ask for a tick as soon as possible: a mission became due now (a NOTIFY from the
        database), or a slot freed while due missions may be waiting. Wake-ups coalesce: many
        before the tick runs give one tick. Only ``run_wakeups`` acts on them."""
        if not self.stopping:
            self._wake.set()

    async def run_wakeups(self) -> None:
        """Tick (``tick_safely``) each time ``wake()`` was called, until cancelled. The daemon
        runs it beside the scheduled tick, which stays the safety net."""
        while not self.stopping:
            await self._wake.wait()
            self._wake.clear()
            if not self.stopping:
                await self.tick_safely()

    async def run_once(self) -> list[RunOutcome]:
        """One tick, then wait for the missions it started; their outcomes in claim order.

        A run that raised (the database went away mid-run) counts as ``error``; its lease
        expires and another tick runs it again.
        """
        tasks = await self.tick()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [r if isinstance(r, str) else "error" for r in results]

    async def drain(self, grace_s: float, hurry: asyncio.Event | None = None) -> None:
        """Stop claiming; wait up to ``grace_s`` seconds (or until ``hurry`` is set), then
        cancel what still runs and wait for the cancelled runs to record their interruption."""
        self.stopping = True
        async with self._tick_lock:  # a tick in flight finishes starting its missions
            pending = set(self.running)
        if not pending:
            return
        logger.info("waiting up to %.1f s for %d running mission(s)", grace_s, len(pending))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
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
        finally:
            if hurried is not None:
                hurried.cancel()
        still = {task for task in still if not task.done()}
        for task in still:
            task.cancel()
        if still:
            logger.warning("interrupting %d mission(s)", len(still))
            await asyncio.gather(*still, return_exceptions=True)

    def _start(self, mission: ClaimedMission) -> asyncio.Task[RunOutcome]:
        task = asyncio.create_task(self.runner.run(mission), name=f"mission-{mission.id}")
        self.running.add(task)
        metrics.MISSIONS_RUNNING.set(len(self.running))
        task.add_done_callback(functools.partial(self._finished, mission.id))
        return task

    def _finished(self, mission_id: int, task: asyncio.Task[RunOutcome]) -> None:
        self.running.discard(task)
        metrics.MISSIONS_RUNNING.set(len(self.running))
        if self._backlog:  # a slot is free and the last claim left due missions behind
            self.wake()
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "mission run failed before its iteration was stored; another tick reruns it "
                "once its lease expires",
                exc_info=task.exception(),
                extra={"mission_id": mission_id},
            )
