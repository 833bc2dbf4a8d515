"""``mcp serve``'s ``/healthz`` verdict on its database (``DatabaseHealth``): a cheap, cached
check that names the cause without the database's address."""

from __future__ import annotations

import asyncio

from worker.mcp.serve_health import DatabaseHealth


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


async def test_a_probe_storm_costs_one_check_per_cache_period() -> None:
    clock, pings = Clock(), []

    async def ping() -> None:
        pings.append(clock.now)
        await asyncio.sleep(0)

    health = DatabaseHealth(ping, cache_s=1.0, clock=clock)
    assert await asyncio.gather(*(health.problem() for _ in range(200))) == [None] * 200
    clock.now += 0.5
    assert await health.problem() is None
    assert len(pings) == 1
    clock.now += 0.6
    assert await health.problem() is None
    assert len(pings) == 2


async def test_an_unreachable_database_is_named_by_its_kind_not_its_address() -> None:
    async def refused() -> None:
        raise ConnectionRefusedError(111, "Connect call failed ('10.1.2.3', 5432)")

    health = DatabaseHealth(refused)
    problem = await health.problem()
    assert problem == "the database is unreachable (ConnectionRefusedError)"


async def test_a_database_that_does_not_answer_in_time_is_unavailable() -> None:
    async def black_hole() -> None:
        await asyncio.Event().wait()

    health = DatabaseHealth(black_hole, timeout_s=0.05)
    assert await health.problem() == "the database did not answer within 0.05 s"
