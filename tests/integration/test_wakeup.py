"""Wake-ups against real PostgreSQL: migration 0007's trigger notifies exactly when a mission
becomes claimable now, and ``WakeUpListener`` turns that into a tick (of ``Worker.run``, the
tick loop) within a second, also after its connection was killed.

The trigger's notifications are counted on a raw asyncpg connection that LISTENs on the channel;
a sentinel notification sent after each action (in a later transaction, so delivered after
everything the action sent) tells when the count is complete, instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import event, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.testing import FunctionChatModel
from tests.integration.worker_harness import (
    LEASE,
    add_mission,
    clock_then_answer,
    iterations,
    make_worker,
)
from worker.daemon.wakeup import WAKE_UP_CHANNEL, WakeUpListener, off_reason
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.tables import missions
from worker.queries.missions import AdminStore
from worker.store.postgres import PostgresMissionStore
from worker.store.records import Interrupted

SENTINEL = "test-sentinel"


class Notifications:
    """Counts the notifications on ``WAKE_UP_CHANNEL`` that a raw asyncpg connection gets."""

    def __init__(self, conn: asyncpg.Connection, engine: AsyncEngine) -> None:
        self.conn = conn
        self.engine = engine
        self.payloads: list[str] = []
        self._sentinel = asyncio.Event()

    def on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == SENTINEL:
            self._sentinel.set()
        else:
            self.payloads.append(payload)

    async def during(self, action: Callable[[], Awaitable[Any]]) -> int:
        """Run ``action``; the number of wake-up notifications it caused."""
        await self._flush()  # what earlier actions sent is in, and not counted
        self.payloads.clear()
        await action()
        await self._flush()
        return len(self.payloads)

    async def _flush(self) -> None:
        """Send the sentinel in a transaction of its own and wait for it: notifications are
        delivered in commit order, so everything committed before is counted by then."""
        self._sentinel.clear()
        async with self.engine.begin() as conn:
            await conn.execute(
                text("SELECT pg_notify(:c, :p)"), {"c": WAKE_UP_CHANNEL, "p": SENTINEL}
            )
        async with asyncio.timeout(5):
            await self._sentinel.wait()


@pytest.fixture
async def notifications(db: AsyncEngine, database_url: str) -> AsyncIterator[Notifications]:
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(dsn)
    counter = Notifications(conn, db)
    await conn.add_listener(WAKE_UP_CHANNEL, counter.on_notification)
    try:
        yield counter
    finally:
        await conn.close()


@pytest.fixture
async def listening(db: AsyncEngine) -> AsyncIterator[tuple[Worker, WakeUpListener]]:
    """A worker whose tick loop ticks once at start (nothing is due yet), then only on
    wake-ups (its listener on ``db``): its interval is an hour."""
    worker = make_worker(db, FunctionChatModel(clock_then_answer))
    listener = WakeUpListener(db, worker.wake, retry_min_s=0.05, retry_max_s=0.2)
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, interval_s=3600)
    scheduler.start()
    listens = asyncio.create_task(listener.run())
    try:
        async with asyncio.timeout(10):
            await listener.listening.wait()
        yield worker, listener
    finally:
        listens.cancel()
        await asyncio.gather(listens, return_exceptions=True)
        worker.stop()
        await worker.drain(10)
        scheduler.shutdown(wait=False)


async def started_within(engine: AsyncEngine, count: int, timeout_s: float) -> float:
    """Seconds until ``count`` iterations exist (polled: a database state, no event to wait on)."""
    begun = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while len(await iterations(engine)) < count:  # noqa: ASYNC110 - polls the server's state
            await asyncio.sleep(0.01)
    return time.monotonic() - begun


# --- the trigger --------------------------------------------------------------------------------


async def test_a_due_insert_notifies_and_a_future_one_does_not(
    db: AsyncEngine, notifications: Notifications
) -> None:
    assert await notifications.during(lambda: add_mission(db)) == 1
    assert await notifications.during(lambda: add_mission(db, due_in=timedelta(hours=1))) == 0
    assert notifications.payloads == []  # constant payload: identical ones collapse


async def test_due_now_is_the_database_clock_and_notifies(
    db: AsyncEngine, notifications: Notifications
) -> None:
    await add_mission(db, due_in=timedelta(hours=1))  # creates the agent
    admin = AdminStore(db)
    added: list[dict[str, Any]] = []

    async def add_due_now() -> None:  # what `missions add --due-now` writes
        added.append(
            await admin.add_mission(
                agent_id=1, objective="o", cron=None, timezone="UTC", next_run_at="now"
            )
        )

    assert await notifications.during(add_due_now) == 1
    assert added[0]["next_run_at"] == added[0]["created_at"]  # the transaction's now()


async def test_a_bulk_insert_of_due_missions_is_one_notification(
    db: AsyncEngine, notifications: Notifications
) -> None:
    await add_mission(db, due_in=timedelta(hours=1))  # creates the agent

    async def insert_many() -> None:
        async with db.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO missions (agent_id, objective, next_run_at) "
                    "SELECT 1, 'o' || n, now() FROM generate_series(1, 500) AS n"
                )
            )

    assert await notifications.during(insert_many) == 1
    async with db.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM missions"))).scalar_one() == 501


async def test_the_claim_and_a_finish_with_a_future_next_run_do_not_notify(
    db: AsyncEngine, notifications: Notifications
) -> None:
    mission_id = await add_mission(db, cron="0 * * * *")  # next run: the top of the hour
    store = PostgresMissionStore(db)
    worker = make_worker(db, FunctionChatModel(clock_then_answer), store=store)
    claimed: list[Any] = []

    async def claim() -> None:
        claimed.extend(await store.claim_due(worker_id="w1", limit=10, lease=LEASE))

    assert await notifications.during(claim) == 0
    assert [m.id for m in claimed] == [mission_id]

    async def run() -> None:  # start, checkpoint, renew, finish: next run an hour away at most
        assert (await worker.runner.run(claimed[0])).outcome == "succeeded"

    assert await notifications.during(run) == 0
    assert [it["status"] for it in await iterations(db)] == ["succeeded"]


async def test_a_released_lease_a_resume_and_a_due_finish_notify(
    db: AsyncEngine, notifications: Notifications
) -> None:
    mission_id = await add_mission(db, cron=None)
    store = PostgresMissionStore(db)
    admin = AdminStore(db)
    [mission] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)

    async def interrupt() -> None:  # another worker should take the run over at once
        assert mission.iteration is not None
        ended = Interrupted(mission.iteration.id, 1, "test")
        assert (await store.end_run(mission, ended, worker_id="w1")).lease_held

    assert await notifications.during(interrupt) == 1
    await admin.pause_mission(mission_id)
    assert (
        await notifications.during(lambda: admin.resume_mission(mission_id, next_run_at=None)) == 1
    )

    async def pause() -> None:
        await admin.pause_mission(mission_id)

    assert await notifications.during(pause) == 0

    async def other_columns() -> None:  # not a column the trigger watches
        async with db.begin() as conn:
            await conn.execute(update(missions).values(objective="changed"))

    assert await notifications.during(other_columns) == 0


# --- the listener -------------------------------------------------------------------------------


async def test_a_due_mission_added_through_the_admin_store_starts_within_1_s(
    db: AsyncEngine, listening: tuple[Worker, WakeUpListener]
) -> None:
    await add_mission(db, due_in=timedelta(hours=1))  # the agent exists; nothing is due
    await add_mission(db)
    assert await started_within(db, 1, timeout_s=5) < 1.0


async def test_the_listener_reconnects_after_its_backend_is_terminated(
    db: AsyncEngine,
    listening: tuple[Worker, WakeUpListener],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, listener = listening
    killed = listener.backend_pid
    assert killed is not None
    with caplog.at_level(logging.INFO, logger="worker.daemon.wakeup"):
        async with db.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
        async with asyncio.timeout(5):
            while listener.backend_pid in (None, killed):  # noqa: ASYNC110 - its state
                await asyncio.sleep(0.01)
        await add_mission(db)
        assert await started_within(db, 1, timeout_s=5) < 2.0
    messages = [r.getMessage() for r in caplog.records if r.name == "worker.daemon.wakeup"]
    assert [m for m in messages if m.startswith("wake-ups: not listening")] != []
    assert len([m for m in messages if m.startswith("wake-ups: not listening")]) == 1
    assert any(m.startswith("wake-ups: listening again on channel mana_ai_due") for m in messages)


async def test_a_cancelled_listener_unlistens_and_returns_its_connection(db: AsyncEngine) -> None:
    woken = asyncio.Event()
    listener = WakeUpListener(db, woken.set)
    task = asyncio.create_task(listener.run())
    async with asyncio.timeout(10):
        await listener.listening.wait()
    pid = listener.backend_pid
    assert db.pool.checkedout() == 1  # type: ignore[attr-defined]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert db.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert not listener.listening.is_set() and listener.backend_pid is None
    async with contextlib.AsyncExitStack() as stack:  # every idle pooled connection
        idle = [await stack.enter_async_context(db.connect()) for _ in range(db.pool.checkedin())]  # type: ignore[attr-defined]
        seen = {}
        for conn in idle:
            row = await conn.execute(
                text("SELECT pg_backend_pid(), array(SELECT pg_listening_channels())")
            )
            backend, channels = row.one()
            seen[backend] = channels
    assert seen[pid] == []  # back in the pool, listening no more
    assert not woken.is_set()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"wake_up": True, "pgbouncer": False, "pool_capacity": 10}, None),
        ({"wake_up": False, "pgbouncer": False, "pool_capacity": 10}, "MANA_AI_WAKE_UP=false"),
        ({"wake_up": True, "pgbouncer": True, "pool_capacity": 10}, "PgBouncer"),
        ({"wake_up": True, "pgbouncer": False, "pool_capacity": 1}, "the only connection"),
        (
            {"wake_up": True, "pgbouncer": True, "pool_capacity": 10, "pgbouncer_detected": True},
            "assumed from the database URL's port 6432",
        ),
    ],
)
def test_off_reason(kwargs: dict[str, Any], reason: str | None) -> None:
    got = off_reason(**kwargs)
    assert got == reason if reason is None else reason in (got or "")


async def test_an_unreachable_database_is_logged_once_and_retried_until_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = create_engine("postgresql://mana@127.0.0.1:1/nowhere", pool_timeout_s=1)
    attempts = 0

    def count(*_: Any) -> None:
        nonlocal attempts
        attempts += 1

    event.listen(engine.sync_engine, "do_connect", count)
    listener = WakeUpListener(engine, lambda: None, retry_min_s=0.01, retry_max_s=0.02)
    try:
        with caplog.at_level(logging.INFO, logger="worker.daemon.wakeup"):
            task = asyncio.create_task(listener.run())
            async with asyncio.timeout(10):
                while attempts < 4:  # noqa: ASYNC110 - counts its retries
                    await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await engine.dispose()
    assert task.cancelled() and not listener.listening.is_set()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "worker.daemon.wakeup"]
    assert warning.startswith("wake-ups: not listening (cannot connect: ")
