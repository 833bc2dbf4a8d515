"""A process that starts rides out a database that blinks at any round trip of its start, as a
running worker rides out one that blinks under a statement (issue 31): every round trip of the
start (``wait_for_database``'s, then the engine's connection, its check, the read of the
schema's revision or the migration) that fails for a transient fault is tried again within
``MANA_AI_DB_START_WAIT_S``; only what is not transient fails at once.

Each test counts the connections and round trips of a clean start through a proxy
(``tests.fakes.db_proxy.FlakyProxy``), then starts again once per connection and per round
trip, that one broken: the connection refused, the round trip cut before the server gets it,
or its answer lost after the server ran it. Every start goes on and runs its due mission.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes import FakeLLMServer
from tests.fakes.db_proxy import FlakyProxy
from tests.integration.worker_harness import add_mission, iterations
from worker.daemon.app import open_app, wait_for_database
from worker.db.revision import HEAD_REVISION
from worker.errors import DatabaseError
from worker.settings import Settings

Fault = Literal["refused", "cut", "lost"]
FAULTS: tuple[Fault, ...] = ("refused", "cut", "lost")


@dataclass(frozen=True)
class Start:
    """What a clean start did through the proxy, after what ``before`` did."""

    connections: int
    round_trips: int
    before: Start | None = None

    def points(self, fault: Fault) -> range:
        """The connections (``refused``) or round trips (``cut``, ``lost``) to break, each
        in turn (those after ``before``'s)."""
        if fault == "refused":
            return range((self.before.connections if self.before else 0) + 1, self.connections + 1)
        return range((self.before.round_trips if self.before else 0) + 1, self.round_trips + 1)


def breaking(proxy: FlakyProxy, fault: Fault, n: int) -> None:
    if fault == "refused":
        proxy.refuse_connection(n)
    else:
        proxy.break_round_trip(n, lose_answer=fault == "lost")


@pytest.fixture
def llm() -> AsyncIterator[FakeLLMServer]:
    with FakeLLMServer() as server:  # answers "Done." to every request
        yield server


def settings_through(proxy: FlakyProxy, database_url: str, llm: FakeLLMServer) -> Settings:
    return Settings(
        database_url=proxy.url_for(database_url),
        llm_base_url=llm.base_url,
        llm_max_retries=0,
        metrics_port=0,
        tick_interval_s=0.2,
    )


async def counted(
    database_url: str,
    llm: FakeLLMServer,
    start: Callable[[Settings], Awaitable[None]],
    *,
    after: Callable[[Settings], Awaitable[None]] | None = None,
) -> Start:
    """The connections and round trips of ``start`` through a proxy that breaks nothing;
    with ``after``, those of ``after`` first, as its ``before``."""
    before = None
    async with FlakyProxy(database_url) as proxy:
        settings = settings_through(proxy, database_url, llm)
        if after is not None:
            await after(settings)
            before = Start(proxy.connections, proxy.round_trips)
        await start(settings)
        assert proxy.connections and proxy.round_trips
        return Start(proxy.connections, proxy.round_trips, before)


async def succeeded(db: AsyncEngine, mission_id: int) -> bool:
    return any(
        row["mission_id"] == mission_id and row["status"] == "succeeded"
        for row in await iterations(db)
    )


async def open_as_tick(settings: Settings) -> None:
    """What ``tick --once`` makes of the database before its claim: ``open_app``."""
    async with open_app(settings):
        pass


@pytest.mark.parametrize("fault", FAULTS)
async def test_tick_once_runs_its_mission_whichever_start_up_round_trip_breaks(
    db: AsyncEngine,
    database_url: str,
    llm: FakeLLMServer,
    fault: Fault,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from worker.cli import main

    start = await counted(database_url, llm, open_as_tick)
    for n in start.points(fault):
        mission = await add_mission(db, cron=None)
        async with FlakyProxy(database_url) as proxy:
            breaking(proxy, fault, n)
            monkeypatch.setenv("MANA_AI_DATABASE_URL", proxy.url_for(database_url))
            monkeypatch.setenv("MANA_AI_LLM_BASE_URL", llm.base_url)
            monkeypatch.setenv("MANA_AI_LLM_MAX_RETRIES", "0")
            code = await asyncio.to_thread(main, ["tick", "--once"])
            err = capsys.readouterr().err
            assert (code, proxy.faults) == (0, 1), f"{fault} {n} of {start}: {err}"
        assert await succeeded(db, mission), f"{fault} {n} of {start}"


async def open_as_worker(settings: Settings) -> None:
    """What ``mana-ai worker`` makes of the database before its first tick, once
    ``wait_for_database`` had an answer: ``open_app`` with the migration."""
    async with open_app(settings, migrate=True):
        pass


@contextlib.asynccontextmanager
async def daemon(settings: Settings) -> AsyncIterator[asyncio.Task[int]]:
    """``mana-ai worker`` in this process (``_worker``'s wait, then ``serve``), stopped on
    exit; the task's result is the exit status."""
    from worker.daemon.serve import serve

    stop = asyncio.Event()

    async def run() -> int:
        await wait_for_database(settings)
        return await serve(settings, stop=stop)

    task = asyncio.create_task(run())
    try:
        yield task
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(task), 30)


async def until(check: Callable[[], Awaitable[bool]], task: asyncio.Task[Any]) -> None:
    deadline = time.monotonic() + 30
    while not await check():
        assert not task.done(), task.exception() if not task.cancelled() else "cancelled"
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_daemon_runs_its_mission_whichever_start_up_round_trip_breaks(
    db: AsyncEngine, database_url: str, llm: FakeLLMServer, fault: Fault
) -> None:
    # those of wait_for_database, the same check as the tick's first (swept above), are not
    # broken again: they were retried before (test_database_faults.py)
    start = await counted(database_url, llm, open_as_worker, after=wait_for_database)
    for n in start.points(fault):
        mission = await add_mission(db, cron=None)
        async with FlakyProxy(database_url) as proxy:
            breaking(proxy, fault, n)
            async with daemon(settings_through(proxy, database_url, llm)) as running:
                await until(lambda: succeeded(db, mission), running)  # noqa: B023
            assert (running.result(), proxy.faults) == (0, 1), f"{fault} {n} of {start}"


async def test_a_migration_broken_in_its_middle_or_at_its_commit_is_run_again_or_found_done(
    postgres_admin_url: str, llm: FakeLLMServer
) -> None:
    # a worker migrates a database that is not at head in one transaction (100+ round trips,
    # a second each: two points, not every one); cut, it rolled back and runs again; with
    # its commit's answer lost (the last round trip), it is found at head by the next attempt
    from tests.conftest import create_database, drop_database
    from worker.db.engine import create_engine
    from worker.db.migrate import current_revision

    url = await create_database(postgres_admin_url, prefix="mana_ai_start")
    try:
        start = await counted(url, llm, open_as_worker)
    finally:
        await drop_database(postgres_admin_url, url)
    points: list[tuple[Fault, int]] = [("cut", start.round_trips // 2), ("lost", start.round_trips)]
    for fault, n in points:
        url = await create_database(postgres_admin_url, prefix="mana_ai_start")
        try:
            async with FlakyProxy(url) as proxy:
                breaking(proxy, fault, n)
                await open_as_worker(settings_through(proxy, url, llm))
                assert proxy.faults == 1, f"{fault} {n} of {start}"
            engine = create_engine(url)
            try:
                assert await current_revision(engine) == HEAD_REVISION
            finally:
                await engine.dispose()
        finally:
            await drop_database(postgres_admin_url, url)


async def test_a_start_gives_up_after_the_wait_naming_what_it_waited_for(
    db: AsyncEngine, database_url: str, llm: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with FlakyProxy(database_url) as proxy:
        settings = settings_through(proxy, database_url, llm)
        database = settings.database.model_copy(update={"start_wait_s": 0.5})
        settings = settings.model_copy(update={"database": database})
        await wait_for_database(settings)  # answered: the outage comes after the first check
        await proxy.outage(3600)
        started = time.monotonic()
        with pytest.raises(DatabaseError) as raised:
            async with open_app(settings):
                pass
    waited = time.monotonic() - started
    assert waited < 3  # no attempt starts after the wait; the one under way may end after it
    assert str(raised.value).startswith("could not connect to PostgreSQL at postgresql+asyncpg://")
    assert str(raised.value).endswith("(retried for 0.5 s: MANA_AI_DB_START_WAIT_S)")
    assert "\n" not in str(raised.value)
    retried = [r.getMessage() for r in caplog.records if "connecting to" in r.getMessage()]
    assert len(retried) >= 2 and "failed (attempt 2: " in retried[1]


async def test_what_is_not_transient_fails_the_start_at_once(
    db: AsyncEngine, database_url: str, llm: FakeLLMServer
) -> None:
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    missing = make_url(database_url).set(database="no_such_database_here")
    settings = Settings(
        database_url=missing.render_as_string(hide_password=False), db_start_wait_s=3600
    )
    with pytest.raises(DatabaseError, match="no_such_database_here") as raised:
        async with open_app(settings):  # would wait an hour if it retried
            pass
    assert "retried" not in str(raised.value)

    async with db.begin() as conn:  # a newer mana-ai migrated it
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    try:
        settings = Settings(database_url=database_url, db_start_wait_s=3600)
        for migrate in (None, True):
            with pytest.raises(DatabaseError, match="newer than this mana-ai knows"):
                async with open_app(settings, migrate=migrate):
                    pass
    finally:
        async with db.begin() as conn:
            head = {"head": HEAD_REVISION}
            await conn.execute(text("UPDATE alembic_version SET version_num = :head"), head)
