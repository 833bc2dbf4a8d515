"""The tick as an APScheduler job (``Worker.schedule`` on an ``AsyncIOScheduler``): a tick at
start, then on the interval or a wake-up, one at a time, coalescing, until stopped. The store
is a stand-in that counts claims (and can hold one); the tests wait on those claims, never on
the clock, except where the interval itself is what is tested (then it is tiny, and only the
count of ticks is asserted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from worker.daemon.worker import Worker
from worker.metrics import HealthState

HOUR_S = 3600.0


class Claims:
    """Stands in for ``MissionStore``: ``claim_due`` counts its calls, runs ``during(n)`` for
    the n-th (hold it, fail it), and claims nothing."""

    def __init__(self, during: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.count = 0
        self.in_flight = 0
        self.most_at_once = 0
        self.finished = 0
        self._during = during
        self._changed = asyncio.Condition()

    async def claim_due(self, **_: Any) -> list[Any]:
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            async with self._changed:
                self.count += 1
                self._changed.notify_all()
            if self._during is not None:
                await self._during(self.count)
            self.finished += 1
            return []
        finally:
            self.in_flight -= 1

    async def begun(self, n: int) -> None:
        """Wait until the n-th claim has begun (10 s at most)."""
        async with asyncio.timeout(10), self._changed:
            await self._changed.wait_for(lambda: self.count >= n)


def worker_on(claims: Claims, health: HealthState | None = None) -> Worker:
    return Worker(
        store=claims,  # type: ignore[arg-type]
        runner=SimpleNamespace(default_model=None),  # type: ignore[arg-type]
        worker_id="w1",
        max_concurrent_missions=2,
        lease=timedelta(seconds=60),
        health=health,
    )


def ticking(worker: Worker, interval_s: float) -> AsyncIOScheduler:
    """``worker`` ticking as the daemon has it tick: its job on a started scheduler."""
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, interval_s)
    scheduler.start()
    return scheduler


async def stopped(worker: Worker, scheduler: AsyncIOScheduler) -> None:
    """Stop as the daemon stops: no more claims, the tick in flight waited for, the
    scheduler shut down."""
    worker.stop()
    await worker.drain(10)
    scheduler.shutdown(wait=False)
    await asyncio.sleep(0)


async def test_it_ticks_at_once_and_then_on_the_interval_without_being_woken() -> None:
    claims = Claims()
    worker = worker_on(claims)
    loop = ticking(worker, 0.01)
    await claims.begun(3)
    await stopped(worker, loop)
    assert claims.most_at_once == 1


async def test_a_wake_up_ticks_at_once_instead_of_after_the_interval() -> None:
    claims = Claims()
    worker = worker_on(claims)
    loop = ticking(worker, HOUR_S)
    await claims.begun(1)
    worker.wake()
    await claims.begun(2)
    await stopped(worker, loop)
    assert claims.count == 2


async def test_wake_ups_during_a_tick_give_one_more_tick_after_it_never_an_overlap() -> None:
    release = asyncio.Event()

    async def hold_the_first(n: int) -> None:
        if n == 1:
            await release.wait()

    claims = Claims(hold_the_first)
    worker = worker_on(claims)
    loop = ticking(worker, HOUR_S)
    await claims.begun(1)
    for _ in range(5):
        worker.wake()
    release.set()
    await claims.begun(2)
    await stopped(worker, loop)
    assert (claims.count, claims.most_at_once) == (2, 1)


async def test_intervals_missed_by_a_slow_tick_collapse_into_one_tick() -> None:
    async def take_ten_intervals(n: int) -> None:
        if n == 1:
            await asyncio.sleep(0.5)

    claims = Claims(take_ten_intervals)
    worker = worker_on(claims)
    loop = ticking(worker, 0.05)
    await claims.begun(2)  # at once after the slow one: its interval had passed
    await stopped(worker, loop)
    assert claims.most_at_once == 1  # never overlapped
    assert claims.count <= 3  # not one per missed interval (ten passed during the first)


async def test_stop_lets_the_tick_in_flight_finish_then_nothing_is_claimed() -> None:
    release = asyncio.Event()

    async def hold(n: int) -> None:
        await release.wait()

    claims = Claims(hold)
    worker = worker_on(claims)
    loop = ticking(worker, HOUR_S)
    await claims.begun(1)
    worker.stop()
    worker.wake()  # ignored once stopping
    release.set()
    await stopped(worker, loop)
    assert (claims.count, claims.finished) == (1, 1)  # finished, not cancelled
    assert await worker.tick() == [] and claims.count == 1


async def test_a_failing_tick_is_reported_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail_the_first(n: int) -> None:
        if n == 1:
            raise OSError("connection refused")

    health = HealthState(stale_after_s=HOUR_S)
    claims = Claims(fail_the_first)
    worker = worker_on(claims, health)
    with caplog.at_level(logging.INFO, logger="worker.daemon.worker"):
        loop = ticking(worker, HOUR_S)
        await claims.begun(1)
        worker.wake()
        await claims.begun(2)
        await stopped(worker, loop)
    assert health.last_error is None and health.last_ok_tick is not None
    messages = [r.getMessage() for r in caplog.records if r.name == "worker.daemon.worker"]
    assert messages[0].startswith("tick failed (OSError: connection refused)")
    assert messages[-1] == "tick recovered after 1 failed tick(s)"


@pytest.mark.parametrize("interval_s", [0.0, -1.0, float("nan")])
async def test_the_interval_must_be_positive(interval_s: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        worker_on(Claims()).schedule(AsyncIOScheduler(), interval_s)
