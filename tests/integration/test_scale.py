"""Scale: many missions at once on a few database connections, and LLM connections bounded.

A worker wired from settings like ``mana-ai worker`` (``open_app``) runs 100 due missions at
concurrency 50 with a pool of 5 against a slow LLM over real HTTP: every mission succeeds, the
worker never holds more than its pool, and another client can connect meanwhile.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ChatMessage, CompletionRequest, CompletionResponse
from planner.testing import FunctionChatModel
from tests.fakes.async_llm_server import AsyncLLMServer
from tests.integration.worker_harness import (
    clock_then_answer,
    iterations,
    make_worker,
    policy_setup,
    ticking,
)
from worker.daemon.app import application_name, open_app
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.tables import mission_iterations, missions
from worker.llm import OpenAICompatibleChatModel
from worker.queries.missions import AdminStore
from worker.settings import load_settings


async def add_due_missions(db: AsyncEngine, count: int) -> None:
    agent = await AdminStore(db).add_agent(name="scale", owner_user_id="u", system_prompt="Hi.")
    due = datetime.now(UTC) - timedelta(seconds=1)
    async with db.begin() as conn:
        await conn.execute(
            insert(missions),
            [
                {
                    "agent_id": agent["id"],
                    "objective": f"Tell the time ({n}).",
                    "cron": "0 * * * *",
                    "timezone": "UTC",
                    "next_run_at": due,
                }
                for n in range(count)
            ],
        )


async def run_until_finished(worker: Worker, db: AsyncEngine, count: int) -> None:
    """The daemon's tick loop (a tick, then one on every wake-up: a freed slot; its interval
    is an hour) until ``count`` finished."""
    async with ticking(worker), asyncio.timeout(60):
        while True:
            await asyncio.sleep(0.05)
            async with db.connect() as conn:
                done = (
                    await conn.execute(
                        select(func.count()).where(mission_iterations.c.finished_at.isnot(None))
                    )
                ).scalar_one()
            if done >= count and not worker.running:
                return


async def test_fifty_missions_at_once_hold_at_most_the_pool(
    db: AsyncEngine, database_url: str
) -> None:
    await add_due_missions(db, 100)
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    peak = 0
    bystander: list[Any] = []

    async def watch() -> None:
        nonlocal peak
        monitor = await asyncpg.connect(dsn)
        try:
            while True:
                held = await monitor.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    application_name("scale-test"),
                )
                peak = max(peak, held)
                if held >= 3 and not bystander:  # the run is under way: another client connects
                    other = await asyncpg.connect(dsn, timeout=5)
                    bystander.append(await other.fetchval("SELECT 1"))
                    await other.close()
                await asyncio.sleep(0.01)
        finally:
            await monitor.close()

    async with AsyncLLMServer(latency_s=0.3) as llm:
        settings = load_settings(
            database_url=database_url,
            llm_base_url=llm.base_url,
            max_concurrent_missions=50,
            db_pool_size=5,
            db_max_overflow=0,
            worker_id="scale-test",
            metrics_port=0,
        )
        async with open_app(settings, migrate=False) as app:
            watcher = asyncio.create_task(watch())
            try:
                await run_until_finished(app.worker, db, 100)
            finally:
                watcher.cancel()
        assert llm.peak <= 50, "one LLM connection per running mission at most"

    async with db.connect() as conn:
        statuses = (
            await conn.execute(text("SELECT status, count(*) FROM mission_iterations GROUP BY 1"))
        ).all()
    assert dict(statuses) == {"succeeded": 100}
    assert 1 <= peak <= 5, f"the worker held {peak} connections with a pool of 5"
    assert bystander == [1], "another client could not connect during the run"


@pytest.mark.parametrize("limit", [1, 10, 20])
async def test_the_llm_client_opens_at_most_max_connections(limit: int) -> None:
    async with AsyncLLMServer(latency_s=0.1) as llm:
        model = OpenAICompatibleChatModel(base_url=llm.base_url, max_connections=limit)
        request = CompletionRequest(messages=[ChatMessage(role="user", content="Hi")])
        try:
            async with asyncio.timeout(30):
                answers = await asyncio.gather(*(model.complete(request) for _ in range(40)))
        finally:
            await model.aclose()
    assert len(answers) == 40
    assert llm.peak <= limit
    # requests wait for a connection rather than fail, and all the allowed ones are used
    assert llm.peak == limit


async def test_a_connection_the_server_ended_costs_a_reconnect_not_a_lost_run(
    db: AsyncEngine, database_url: str
) -> None:
    # a worker with one pooled connection; the server ends it while the mission waits for
    # the LLM: the gate's ledger and the finish go through on a new connection (opened in
    # its place when it is taken, or, when asyncpg has not read the server's goodbye by
    # then, after the statement met the ended one and ran again)
    await add_due_missions(db, 1)
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)

    ended_at_round: list[int] = []

    async def end_the_workers_connection(request: CompletionRequest) -> CompletionResponse:
        if ended_at_round:
            return clock_then_answer(request)
        ended_at_round.append(1)
        admin = await asyncpg.connect(dsn)
        try:
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'mana-ai-ended' AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        assert ended == 1
        return clock_then_answer(request)

    try:
        async with engine.connect() as conn:  # name the pooled connection, to end it
            await conn.execute(text("SET application_name = 'mana-ai-ended'"))
            await conn.commit()
        worker = make_worker(
            engine,
            FunctionChatModel(end_the_workers_connection),
            policy=policy_setup(engine, "enforce"),  # its ledger meets the ended connection
        )
        assert await worker.run_once() == ["succeeded"]
    finally:
        await engine.dispose()
    assert ended_at_round == [1]  # the connection was ended (the model asserted it, once)
    [it] = await iterations(db)
    assert it["status"] == "succeeded" and it["rounds"] == 2
    async with db.connect() as conn:
        outcomes = (await conn.execute(text("SELECT outcome FROM tool_invocations"))).all()
    assert [o for (o,) in outcomes] == ["ok"], "the gate decided the call on a new connection"


async def test_a_light_load_keeps_to_the_connections_it_used_last(database_url: str) -> None:
    """Once a burst opened the whole pool, one statement at a time takes the connection
    given back last (LIFO), not each pooled one in turn: the backends in use stay few and warm
    (their plans and caches), and the others idle, for the server or PgBouncer to close."""
    engine = create_engine(database_url, pool_size=4, max_overflow=0)
    try:
        burst = [await engine.raw_connection() for _ in range(4)]
        for fairy in burst:
            fairy.close()
        backends = set()
        for _ in range(8):
            async with engine.connect() as conn:
                backends.add((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
        assert len(backends) == 1
    finally:
        await engine.dispose()
