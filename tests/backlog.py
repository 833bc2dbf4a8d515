"""Running a worker through a backlog in tests: ``run_until_stored``."""

from __future__ import annotations

import asyncio
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from worker.daemon.worker import Worker


async def run_until_stored(worker: Worker, count: int, *, within_s: float = 30) -> None:
    """``worker`` ticking as the daemon has it tick (its job on a scheduler, a tick an hour:
    only the first tick, wake-ups and finishes claim) until ``count`` runs' ends were stored
    (``end_run`` returned, whatever it returned), then ``drain`` (10 s of grace) and the
    scheduler shut down.

    Raises:
        TimeoutError: fewer were stored within ``within_s`` seconds.
    """
    reached = asyncio.Event()
    store: Any = worker.store
    end_run, stored = store.end_run, 0

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal stored
        done = await end_run(*args, **kwargs)
        stored += 1
        if stored >= count:
            reached.set()
        return done

    store.end_run = counted
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, 3600)
    scheduler.start()
    try:
        async with asyncio.timeout(within_s):
            await reached.wait()
    finally:
        await worker.drain(10)
        scheduler.shutdown(wait=False)
