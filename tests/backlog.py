"""Running a worker through a backlog in tests: ``run_until_stored``."""

from __future__ import annotations

import asyncio
from typing import Any

from worker.daemon.tick import Worker


async def run_until_stored(worker: Worker, count: int, *, within_s: float = 30) -> None:
    """``worker.run`` (a tick an hour: only the first tick, wake-ups and finishes claim) until
    ``count`` runs' ends were stored (``finish_iteration`` returned, whatever it returned),
    then ``drain`` (10 s of grace) and wait for the loop to end.

    Raises:
        TimeoutError: fewer were stored within ``within_s`` seconds.
    """
    reached = asyncio.Event()
    store: Any = worker.store
    finish, stored = store.finish_iteration, 0

    async def counted(*args: Any, **kwargs: Any) -> bool:
        nonlocal stored
        done: bool = await finish(*args, **kwargs)
        stored += 1
        if stored >= count:
            reached.set()
        return done

    store.finish_iteration = counted
    loop = asyncio.create_task(worker.run(interval_s=3600))
    try:
        async with asyncio.timeout(within_s):
            await reached.wait()
    finally:
        await worker.drain(10)
        await loop
