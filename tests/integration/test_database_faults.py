"""A database that blinks loses nothing: a proxy between the worker and PostgreSQL cuts every
connection and refuses new ones for a while (``tests.fakes.db_proxy.FlakyProxy``), at the
moments that used to lose runs: while a finished run is stored, while a write is journaled,
while a tool writes. Infrastructure faults are the runner's to recover: the run waits and
retries while its lease holds, or stops and is resumed by the next claim; the model is never
told to try again, and no run is stored ``store_failed`` for a fault that is not its data's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, ToolContext
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.fakes.db_proxy import FlakyProxy
from tests.integration.worker_harness import (
    add_mission,
    iterations,
    make_worker,
    objective_of,
    tool_results,
)
from worker.db.engine import create_engine
from worker.db.tables import missions, notes, tool_invocations
from worker.tools import builtin_tools

TRY_AGAIN = "try again"


@pytest.fixture
async def flaky_engine(proxy: FlakyProxy, database_url: str) -> AsyncIterator[AsyncEngine]:
    """The worker's engine, through the proxy (the test reads through ``db``, directly)."""
    engine = create_engine(proxy.url_for(database_url), pool_size=4, max_overflow=0)
    yield engine
    await engine.dispose()


async def note_titles(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(notes.c.title).order_by(notes.c.title))).scalars())


async def test_a_blip_while_finished_runs_are_stored_loses_none(
    db: AsyncEngine,
    proxy: FlakyProxy,
    flaky_engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """12 one-shot missions write a note, then answer while every connection is cut; the
    database comes back once the store of a finished run met the outage (whatever the
    machine's load, the stores run into it)."""
    ids = [await add_mission(db, cron=None, objective=f"note {i:02d}") for i in range(12)]
    all_writing = asyncio.Barrier(12)
    met = asyncio.Event()

    class StoreMetOutage(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "storing the end of the run failed" in record.getMessage():
                met.set()

    async def model(request: CompletionRequest) -> CompletionResponse:
        results = tool_results(request)
        if not results:
            return tool_calls(("notes_create", {"title": objective_of(request)}))
        assert not any(TRY_AGAIN in r for r in results), results
        if await all_writing.wait() == 0:  # every mission's note is in: the answers are due
            await proxy.outage(30)  # until a store meets it (below)
        return final_answer("Saved.")

    async def back_once_met() -> None:
        await met.wait()
        proxy.end_outage()

    watcher = StoreMetOutage()
    logging.getLogger("worker.db.transient").addHandler(watcher)
    back = asyncio.create_task(back_once_met())
    worker = make_worker(flaky_engine, FunctionChatModel(model), max_concurrent=12)
    try:
        with caplog.at_level("WARNING", logger="worker.db.transient"):
            assert await worker.run_once() == ["succeeded"] * 12
    finally:
        logging.getLogger("worker.db.transient").removeHandler(watcher)
        back.cancel()
    assert proxy.outages == 1
    # the stores did meet the outage, and were retried
    assert any("storing the end of the run failed" in r.message for r in caplog.records)
    its = await iterations(db)
    assert [(it["status"], it["stop_reason"], it["rounds"]) for it in its] == [
        ("succeeded", "final_answer", 2)
    ] * 12
    assert all(len(it["messages"]) == 5 for it in its)  # system, user, call, result, answer
    assert await note_titles(db) == [f"note {i:02d}" for i in range(12)]
    async with db.connect() as conn:
        statuses = (
            await conn.execute(select(missions.c.status).where(missions.c.id.in_(ids)))
        ).scalars()
        assert set(statuses) == {"completed"}


async def test_two_outages_over_100_missions_lose_none(
    db: AsyncEngine, proxy: FlakyProxy, flaky_engine: AsyncEngine
) -> None:
    """100 one-shot missions, 20 at a time, through two 1.5 s outages (bench/db_outage.py
    runs the 5 s ones): every mission stores its run and its one note."""
    for i in range(100):
        await add_mission(db, cron=None, objective=f"note {i:03d}")
    answered = 0

    async def model(request: CompletionRequest) -> CompletionResponse:
        nonlocal answered
        results = tool_results(request)
        # a write cut off by the outage is reported on resume with what the tool can tell
        if not results or "no note was created by that call" in results[-1]:
            return tool_calls(("notes_create", {"title": objective_of(request)}))
        assert not any(TRY_AGAIN in r for r in results), results
        answered += 1
        if answered in (15, 60):  # mid-run, with missions at every stage
            await proxy.outage(1.5)
        return final_answer("Saved.")

    worker = make_worker(flaky_engine, FunctionChatModel(model), max_concurrent=20)
    outcomes: list[str] = []
    interrupted = 0
    while len(outcomes) < 100:
        try:
            ran = await worker.run_once()
        except Exception:  # the claim met an outage: the daemon's next tick claims again
            await asyncio.sleep(0.1)
            continue
        # a run whose tool met the outage stops, and the next claim resumes it
        interrupted += ran.count("interrupted")
        outcomes += [o for o in ran if o != "interrupted"]
    assert outcomes == ["succeeded"] * 100 and proxy.outages == 2
    its = await iterations(db)
    assert sum(it["attempt"] - 1 for it in its) == interrupted
    assert len(its) == 100 and {it["status"] for it in its} == {"succeeded"}
    assert await note_titles(db) == [f"note {i:03d}" for i in range(100)]


async def test_a_write_waits_for_the_journal_through_an_outage(
    db: AsyncEngine, proxy: FlakyProxy, flaky_engine: AsyncEngine
) -> None:
    """The database goes away as the model asks for a write: the call is not run unrecorded,
    and the model is not told to try again; the run waits for the journal, then writes."""
    await add_mission(db, cron=None, objective="note")
    seen: list[str] = []

    async def model(request: CompletionRequest) -> CompletionResponse:
        results = tool_results(request)
        seen.extend(results)
        if not results:
            await proxy.outage(1.0)
            return tool_calls(("notes_create", {"title": "once"}))
        return final_answer("Saved.")

    worker = make_worker(flaky_engine, FunctionChatModel(model))
    assert await worker.run_once() == ["succeeded"]
    [result] = seen
    assert json.loads(result)["title"] == "once"
    assert await note_titles(db) == ["once"]
    async with db.connect() as conn:
        [call] = (await conn.execute(select(tool_invocations))).mappings().all()
    assert (call["tool"], call["outcome"], call["attempt"]) == ("notes_create", "ok", 1)


async def test_an_outage_longer_than_the_lease_is_resumed_by_the_next_claim(
    db: AsyncEngine, proxy: FlakyProxy, flaky_engine: AsyncEngine
) -> None:
    """The journal stays unreachable past the lease: the run stops without running the write
    or telling the model anything; after the outage the next claim runs the mission again,
    and it succeeds with exactly one note."""
    await add_mission(db, cron=None, objective="note")
    seen: list[str] = []
    requests = 0

    async def model(request: CompletionRequest) -> CompletionResponse:
        nonlocal requests
        requests += 1
        results = tool_results(request)
        seen.extend(results)
        if not results:
            if requests == 1:
                await proxy.outage(3.0)
            return tool_calls(("notes_create", {"title": "once"}))
        return final_answer("Saved.")

    worker = make_worker(flaky_engine, FunctionChatModel(model), lease=timedelta(seconds=1.5))
    assert await worker.run_once() == ["interrupted"]
    assert await note_titles(db) == []
    await proxy.back_up()
    await asyncio.sleep(0.5)  # the lease has expired by now (1.5 s into a 3 s outage)
    assert await worker.run_once() == ["succeeded"]
    assert not any(TRY_AGAIN in r for r in seen)
    assert await note_titles(db) == ["once"]
    [it] = await iterations(db)
    assert (it["status"], it["attempt"]) == ("succeeded", 2)


async def test_a_write_whose_database_fails_under_it_is_made_again_by_the_resume(
    db: AsyncEngine, proxy: FlakyProxy, flaky_engine: AsyncEngine
) -> None:
    """The notes database fails under notes_create itself: the run stops, the next claim
    resumes it and makes the call again with the same idempotency key (notes_create is
    idempotent): one note, and the model never had to decide anything about the fault."""
    await add_mission(db, cron=None, objective="note")
    tools = {t.name: t for t in builtin_tools(flaky_engine)}
    real_create = tools["notes_create"].effect
    assert real_create is not None  # a run commits it with the call's record

    async def create_in_an_outage(args: dict[str, Any], ctx: ToolContext, conn: Any) -> Any:
        await proxy.outage(0.5)
        return await real_create(args, ctx, conn)

    flaky = [
        dataclasses.replace(t, effect=create_in_an_outage) if t.name == "notes_create" else t
        for t in tools.values()
    ]
    steady = list(tools.values())
    seen: list[str] = []

    def model(request: CompletionRequest) -> CompletionResponse:
        results = tool_results(request)
        seen.extend(results)
        if not results:
            return tool_calls(("notes_create", {"title": "once"}))
        return final_answer("Saved.")

    first = make_worker(flaky_engine, FunctionChatModel(model), tools_for=lambda m: flaky)
    assert await first.run_once() == ["interrupted"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"]) == ("failed", "interrupted")
    assert "notes_create: its database did not answer" in it["error"]

    second = make_worker(flaky_engine, FunctionChatModel(model), tools_for=lambda m: steady)
    assert await second.run_once() == ["succeeded"]
    [result] = seen
    assert json.loads(result)["title"] == "once"  # the call's own result, made again
    assert await note_titles(db) == ["once"]
    [it] = await iterations(db)
    assert (it["status"], it["attempt"], it["rounds"]) == ("succeeded", 2, 2)
    async with db.connect() as conn:
        [call] = (await conn.execute(select(tool_invocations))).mappings().all()
    assert (call["tool"], call["outcome"], call["attempt"]) == ("notes_create", "ok", 1)


async def test_a_write_that_is_not_idempotent_is_reported_not_made_again(
    db: AsyncEngine, proxy: FlakyProxy, flaky_engine: AsyncEngine
) -> None:
    """A write whose tool cannot promise to apply a key once, and whose effect does not commit
    with its record (here notes_update without its ``effect``), is not made again on resume:
    the model reads what the tool can tell about it."""
    async with db.begin() as conn:
        note_id = (
            await conn.execute(
                notes.insert().values(user_id="u1", title="old").returning(notes.c.id)
            )
        ).scalar_one()
    await add_mission(db, cron=None, objective="rename")
    tools = {t.name: t for t in builtin_tools(flaky_engine)}
    real_update = tools["notes_update"].handler

    async def update_in_an_outage(args: dict[str, Any], ctx: ToolContext) -> Any:
        await proxy.outage(0.5)
        return await real_update(args, ctx)

    flaky = [
        dataclasses.replace(t, handler=update_in_an_outage, effect=None)
        if t.name == "notes_update"
        else t
        for t in tools.values()
    ]
    seen: list[str] = []

    def model(request: CompletionRequest) -> CompletionResponse:
        results = tool_results(request)
        seen.extend(results)
        if not results:
            return tool_calls(("notes_update", {"id": note_id, "title": "new"}))
        return final_answer("Renamed, or not.")

    first = make_worker(flaky_engine, FunctionChatModel(model), tools_for=lambda m: flaky)
    assert await first.run_once() == ["interrupted"]
    unlike = [dataclasses.replace(t, effect=None) for t in tools.values()]
    second = make_worker(flaky_engine, FunctionChatModel(model), tools_for=lambda m: unlike)
    assert await second.run_once() == ["succeeded"]
    [report] = seen
    assert "its outcome is unknown" in report and f"note {note_id} exists now" in report
    assert not any(TRY_AGAIN in r for r in seen)


async def test_a_built_in_write_whose_database_fails_under_it_is_made_again_once(
    db: AsyncEngine, proxy: FlakyProxy, flaky_engine: AsyncEngine
) -> None:
    """notes_update is not idempotent, but its effect commits with its call's record: a
    database that fails under it rolls both back, so the resume makes it again, once, and the
    model reads the update's own result, never that its outcome is unknown."""
    async with db.begin() as conn:
        note_id = (
            await conn.execute(
                notes.insert().values(user_id="u1", title="old").returning(notes.c.id)
            )
        ).scalar_one()
    await add_mission(db, cron=None, objective="rename")
    tools = {t.name: t for t in builtin_tools(flaky_engine)}
    real_update = tools["notes_update"].effect
    assert real_update is not None

    async def update_in_an_outage(args: dict[str, Any], ctx: ToolContext, conn: Any) -> Any:
        await proxy.outage(0.5)
        return await real_update(args, ctx, conn)

    flaky = [
        dataclasses.replace(t, effect=update_in_an_outage) if t.name == "notes_update" else t
        for t in tools.values()
    ]
    seen: list[str] = []

    def model(request: CompletionRequest) -> CompletionResponse:
        results = tool_results(request)
        seen.extend(results)
        if not results:
            return tool_calls(("notes_update", {"id": note_id, "title": "new"}))
        return final_answer("Renamed.")

    first = make_worker(flaky_engine, FunctionChatModel(model), tools_for=lambda m: flaky)
    assert await first.run_once() == ["interrupted"]
    second = make_worker(flaky_engine, FunctionChatModel(model))
    assert await second.run_once() == ["succeeded"]
    [result] = seen
    assert json.loads(result)["title"] == "new" and json.loads(result)["changed"] == ["title"]
    assert await note_titles(db) == ["new"]


async def test_data_the_database_refuses_is_stored_as_a_failure_with_its_log(
    db: AsyncEngine,
) -> None:
    """What the database refuses (here a trigger an operator added) is not retried: the run
    is stored ``store_failed`` with as much as the database takes, its message log included,
    and the one-shot mission is not run again."""
    async with db.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION refuse_clock() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "RAISE EXCEPTION 'clock calls are not stored here' USING ERRCODE = '22023'; "
                "END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_clock BEFORE INSERT ON tool_invocations FOR EACH ROW "
                "WHEN (NEW.tool = 'clock_now') EXECUTE FUNCTION refuse_clock()"
            )
        )
    try:
        await add_mission(db, cron=None)

        def model(request: CompletionRequest) -> CompletionResponse:
            if tool_results(request):
                return final_answer("It is late.")
            return tool_calls(("clock_now", {}))

        assert await make_worker(db, FunctionChatModel(model)).run_once() == ["failed"]
        [it] = await iterations(db)
        assert (it["status"], it["stop_reason"], it["rounds"]) == ("failed", "store_failed", 2)
        assert "clock calls are not stored here" in it["error"]
        assert [m["role"] for m in it["messages"]] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        async with db.connect() as conn:
            calls = (await conn.execute(select(func.count()).select_from(tool_invocations))).one()
            status = (await conn.execute(select(missions.c.status))).scalar_one()
        assert calls == (0,) and status == "completed"
    finally:
        async with db.begin() as conn:
            await conn.execute(text("DROP TRIGGER refuse_clock ON tool_invocations"))
            await conn.execute(text("DROP FUNCTION refuse_clock()"))


async def test_a_statement_on_a_black_holed_connection_fails_in_time_and_is_retried(
    proxy: FlakyProxy, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The network drops every byte (no reset, no refusal): a statement used to wait for
    ever. With MANA_AI_DB_STATEMENT_TIMEOUT_S it fails as a transient fault, and a caller
    that retries (``retry_transient``, as storing a run's end does) gets its answer once the
    network is back."""
    import time

    from worker.db.configured import open_database
    from worker.db.engine import run_statement
    from worker.db.transient import retry_transient
    from worker.settings import Settings

    settings = Settings(database_url=proxy.url_for(database_url), db_statement_timeout_s=1)
    attempts = 0

    async def select_one() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts == 2:
            proxy.restore()  # the second attempt finds the network back
        return await run_statement(engine, text("SELECT 1 AS one"))

    async with open_database(settings, migrate=False) as engine:
        proxy.black_hole()
        async with asyncio.timeout(60):  # a guard: without the timeout it never returns
            rows = await retry_transient(
                select_one, deadline=time.monotonic() + 30, what="the test's statement"
            )
    assert [dict(r) for r in rows] == [{"one": 1}]
    assert attempts == 2
    [retried] = [r.getMessage() for r in caplog.records if "the test's statement" in r.getMessage()]
    assert retried.startswith("the test's statement failed (attempt 1: TimeoutError: no answer")


async def test_a_worker_started_during_an_outage_waits_for_the_database(
    proxy: FlakyProxy, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.daemon.app import wait_for_database
    from worker.settings import Settings

    settings = Settings(database_url=proxy.url_for(database_url))
    await proxy.outage(1.0)  # the database comes back by itself
    await wait_for_database(settings, wait_s=30)  # was: exit 1 at once
    retried = [
        r.getMessage() for r in caplog.records if "connecting to PostgreSQL" in r.getMessage()
    ]
    assert retried, "each failed attempt is logged"
    assert retried[0].startswith("connecting to PostgreSQL at postgresql+asyncpg://")
    assert "failed (attempt 1: " in retried[0]


async def test_a_database_that_stays_down_fails_the_start_with_the_clear_error(
    proxy: FlakyProxy, database_url: str
) -> None:
    from worker.daemon.app import wait_for_database
    from worker.errors import DatabaseError
    from worker.settings import Settings

    settings = Settings(database_url=proxy.url_for(database_url))
    await proxy.outage(3600)
    with pytest.raises(DatabaseError, match=r"^could not connect to PostgreSQL at "):
        await wait_for_database(settings, wait_s=0.3)


async def test_a_failure_that_is_not_transient_fails_the_start_at_once(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlalchemy.engine import make_url

    from worker.daemon.app import wait_for_database
    from worker.errors import DatabaseError
    from worker.settings import Settings

    missing = make_url(database_url).set(database="no_such_database_here")
    settings = Settings(database_url=missing.render_as_string(hide_password=False))
    with pytest.raises(DatabaseError, match="no_such_database_here"):
        await wait_for_database(settings, wait_s=3600)  # would wait an hour if it retried
    assert not [r for r in caplog.records if "connecting to PostgreSQL" in r.getMessage()]
