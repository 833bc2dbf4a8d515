"""A switchover under a running worker (issue 36): a primary and a synchronous streaming
standby of the test's own (``tests.pg_standby``), a worker whose URL lists both with
``target_session_attrs=read-write``, 40 missions writing one note each, and in the middle the
primary stops (a switchover, or a crash) and the standby is promoted. The same worker carries
on on the new primary: every mission succeeds once, every note is written once, wake-ups come
from the new primary. The figures (how soon it wrote again, how long the 40 took, how many
runs waited for their lease) are logged as a warning; docs/how-to/high-availability.md quotes
them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.worker_harness import (
    add_mission,
    iterations,
    make_worker,
    objective_of,
    ticking,
    tool_results,
)
from tests.pg_standby import PrimaryAndStandby, StandbyUnavailable, start_pair
from worker.daemon.wakeup import WakeUpListener
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import mission_iterations, notes
from worker.db.transient import retry_transient

pytestmark = pytest.mark.standby

MISSIONS = 40
SWITCH_AFTER_NOTES = 10
MODEL_LATENCY_S = 0.2
TICK_INTERVAL_S = 5.0
LEASE = timedelta(seconds=10)
"""Missions a finish claimed ahead as the primary crashed wait for it: the claim committed
(and reached the standby) but its answer was lost, and a claim is not run twice."""
NO_PRIMARY_S = 1.5
"""Seconds between the primary's stop and the standby's promotion: no server takes writes."""

logger = logging.getLogger(__name__)


@pytest.fixture
def pair() -> Iterator[PrimaryAndStandby]:
    try:
        started = start_pair()
    except StandbyUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def ha_url(pair: PrimaryAndStandby) -> str:
    """A migrated database ``mana`` on the primary, as a URL listing both servers."""
    conn = await asyncpg.connect(host="127.0.0.1", port=pair.primary_port, user="postgres")
    try:
        await conn.execute("CREATE DATABASE mana")
    finally:
        await conn.close()
    migrator = create_engine(pair.url("mana"), pool_size=1, max_overflow=0)
    try:
        await upgrade_database(migrator)
    finally:
        await migrator.dispose()
    return pair.url("mana")


@pytest.fixture
async def reader(ha_url: str) -> AsyncIterator[AsyncEngine]:
    """The test's own engine on the same URL (it follows the switchover too)."""
    engine = create_engine(ha_url, pool_size=2, max_overflow=0)
    yield engine
    await engine.dispose()


async def count_iterations(engine: AsyncEngine, *, succeeded: bool) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(mission_iterations)
        if succeeded:
            query = query.where(mission_iterations.c.status == "succeeded")
        return int((await conn.execute(query)).scalar_one())


async def wait_for(engine: AsyncEngine, count: int, timeout_s: float, *, succeeded: bool) -> float:
    """Seconds until ``count`` iterations started (or ``succeeded``), polled: a database
    state. The test's reads meet the switchover too, and wait it out as the worker does."""
    begun = time.monotonic()
    deadline = begun + timeout_s

    async def counted() -> int:
        return await count_iterations(engine, succeeded=succeeded)

    async with asyncio.timeout(timeout_s):
        while await retry_transient(counted, deadline=deadline, what="polling") < count:  # noqa: ASYNC110 - polls the server
            await asyncio.sleep(0.01)
    return time.monotonic() - begun


@pytest.mark.parametrize("stop_mode", ["fast", "immediate"])
async def test_a_switchover_under_a_running_worker_loses_and_repeats_nothing(
    pair: PrimaryAndStandby,
    ha_url: str,
    reader: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
    stop_mode: str,
) -> None:
    """``fast``: a planned switchover; ``immediate``: the primary crashes (writes in flight
    get no answer, and are retried on the new primary)."""
    caplog.set_level(logging.WARNING)
    for i in range(MISSIONS):
        await add_mission(reader, cron=None, objective=f"note {i:02d}")
    written: list[float] = []  # when the model saw each note's result
    switch: dict[str, float] = {}

    async def switch_over() -> None:
        switch["begun"] = time.monotonic()
        await asyncio.to_thread(pair.switch_over, NO_PRIMARY_S, mode=stop_mode)
        switch["promoted"] = time.monotonic()

    switching: asyncio.Task[None] | None = None

    async def model(request: CompletionRequest) -> CompletionResponse:
        nonlocal switching
        await asyncio.sleep(MODEL_LATENCY_S)  # runs are in flight when the primary stops
        results = tool_results(request)
        assert not any("try again" in r for r in results), results
        # a write cut off by the switchover is reported on resume with what the tool can tell
        if not results or "no note was created by that call" in results[-1]:
            return tool_calls(("notes_create", {"title": objective_of(request)}))
        written.append(time.monotonic())
        if len(written) == SWITCH_AFTER_NOTES:
            switching = asyncio.create_task(switch_over())
        return final_answer("Saved.")

    engine = create_engine(ha_url, pool_size=8, max_overflow=0)
    worker = make_worker(engine, FunctionChatModel(model), max_concurrent=8, lease=LEASE)
    listener = WakeUpListener(engine, worker.wake)
    listens = asyncio.create_task(listener.run())
    try:
        async with ticking(worker, interval_s=TICK_INTERVAL_S):
            took = await wait_for(reader, MISSIONS, timeout_s=45, succeeded=True)
            assert switching is not None
            await switching
            # wake-ups: the listener is back, on the new primary, and a due mission starts
            # at once, not at the next tick
            async with asyncio.timeout(35):
                while not listener.listening.is_set():  # noqa: ASYNC110 - its state
                    await asyncio.sleep(0.05)
            listening_on = await listener_port(reader, listener.backend_pid)
            await add_mission(reader, cron=None, objective="after")
            started_in = await wait_for(
                reader, MISSIONS + 1, timeout_s=TICK_INTERVAL_S, succeeded=False
            )
            await wait_for(reader, MISSIONS + 1, timeout_s=10, succeeded=True)
    finally:
        listens.cancel()
        await asyncio.gather(listens, return_exceptions=True)
        await engine.dispose()

    carried_on_s = min(t for t in written if t > switch["promoted"]) - switch["promoted"]
    its = await iterations(reader)
    retried = [
        r
        for r in caplog.records
        if r.name.startswith("worker.")
        and " failed (attempt" in r.getMessage()
        and not r.getMessage().startswith("polling")
    ]
    logger.warning(
        "switchover (%s stop): no primary for %.2f s; the worker wrote again %.2f s after the "
        "promotion; %d missions in %.1f s, %d resumed, %d database retries logged; a wake-up "
        "started a mission in %.2f s",
        stop_mode,
        switch["promoted"] - switch["begun"],
        carried_on_s,
        MISSIONS,
        took,
        sum(it["attempt"] > 1 for it in its),
        len(retried),
        started_in,
    )
    assert len(its) == MISSIONS + 1
    assert {it["status"] for it in its} == {"succeeded"}
    assert len({it["mission_id"] for it in its}) == MISSIONS + 1  # each ran once
    async with reader.connect() as conn:
        titles = (await conn.execute(select(notes.c.title).order_by(notes.c.title))).scalars()
        assert list(titles) == ["after", *(f"note {i:02d}" for i in range(MISSIONS))]  # once
        port = (await conn.execute(text("SELECT inet_server_port()"))).scalar_one()
    assert port == pair.standby_port  # the data is on the promoted standby
    assert listening_on == pair.standby_port
    assert started_in < 1.0  # the tick is 5 s away: the wake-up started it


async def listener_port(engine: AsyncEngine, pid: int | None) -> int | None:
    """The port of the engine's current primary when backend ``pid`` (the listener's) is one
    of its sessions, else ``None``."""
    async with engine.connect() as conn:
        found = await conn.execute(
            text(
                "SELECT inet_server_port() FROM pg_stat_activity "
                "WHERE pid = :pid AND backend_type = 'client backend'"
            ),
            {"pid": pid},
        )
        return found.scalar_one_or_none()
