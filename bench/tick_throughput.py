"""Tick throughput: missions per second for one worker with an instant fake LLM, and the
database round trips each mission costs.

Not a test: it prints figures. Usage::

    python bench/tick_throughput.py [--missions 500] [--concurrency 4] [--pool 10]
        [--direct] [--gate] [--tracing off|on|both]

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a fresh database is created in that server
and dropped afterwards), else an embedded PostgreSQL in a temporary directory.

Each mission runs two rounds (one ``clock_now`` tool call, then a final answer) through the
real tick, runner, stores and built-in tools; only the LLM is instant (in-process). The worker
claims as a daemon does: a tick, then a wake-up whenever a slot frees while missions wait.
Round trips are counted at the wire by a proxy in front of PostgreSQL
(``bench.common.RoundTripCounter``: every Sync or simple Query the worker sends, BEGIN and
COMMIT included, and the set-up of its pool's connections); statements are counted by a
SQLAlchemy ``before_cursor_execute`` listener and, for those that go to asyncpg directly (the
claim and the runs' writes, ``worker.store.prepared``), where the store runs them. The
policy gate is off unless ``--gate``. The proxy runs in the worker's event loop and costs it
CPU: ``--direct`` measures missions per second without it (and without the count).
``--tracing on`` traces the runs as ``MANA_AI_OTEL=on`` does (spans and the
``gen_ai.client.*`` metrics exported over OTLP/HTTP to an endpoint in another process that
drops them, ``bench.common.otlp_sink``); ``--tracing both`` runs off then on, each on a fresh
database, and prints their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import event, func, insert, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    RoundTripCounter,
    at_least,
    database_server,
    otlp_sink,
    throwaway_database,
)
from planner import ChatModel, CompletionRequest, CompletionResponse
from planner.policy import PolicyConfig
from planner.testing import FunctionChatModel, final_answer, tool_calls
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import agents, mission_iterations, missions
from worker.policy_setup import PolicySetup
from worker.run.runner import MissionRunner
from worker.store.ledger import PostgresCallLedger
from worker.store.postgres import PostgresMissionStore
from worker.tools import builtin_tools


def instant_llm(request: CompletionRequest) -> CompletionResponse:
    if any(m.role == "tool" for m in request.messages):
        return final_answer("done")
    return tool_calls(("clock_now", {}))


async def add_missions(url: str, count: int, *, users: int = 1) -> None:
    """Migrate the database at ``url`` and add ``count`` due missions, spread over ``users``
    agents (each its own owner)."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        await upgrade_database(engine)
        async with engine.begin() as conn:
            found = await conn.execute(
                insert(agents).returning(agents.c.id),
                [
                    {"name": f"bench{n}", "owner_user_id": f"u{n}", "system_prompt": "Be brief."}
                    for n in range(users)
                ],
            )
            agent_ids = list(found.scalars())
            due = datetime.now(UTC) - timedelta(seconds=1)
            await conn.execute(
                insert(missions),
                [
                    {
                        "agent_id": agent_ids[n % users],
                        "objective": "Tell the time.",
                        "cron": "0 * * * *",
                        "timezone": "UTC",
                        "next_run_at": due,
                    }
                    for n in range(count)
                ],
            )
    finally:
        await engine.dispose()


async def run_all(worker: Worker, engine_url: str, count: int) -> int:
    """The daemon's tick loop (a tick, then one on every wake-up; its interval is an hour)
    until ``count`` iterations finished; how many finished."""
    watcher = create_engine(
        engine_url, pool_size=1, max_overflow=0, application_name="mana-ai-bench-watcher"
    )
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, 3600)
    scheduler.start()
    try:
        while True:
            await asyncio.sleep(0.05)
            async with watcher.connect() as conn:
                done = (
                    await conn.execute(
                        select(func.count()).where(mission_iterations.c.finished_at.is_not(None))
                    )
                ).scalar_one()
            if done >= count and not worker.running:
                return done
    finally:
        await worker.drain(60)
        scheduler.shutdown(wait=False)
        await watcher.dispose()


async def bench(
    server_url: str,
    count: int,
    concurrency: int,
    pool: int,
    direct: bool,
    gate: bool,
    tracing: bool = False,
) -> float:
    """Run ``count`` missions and print the figures; missions per second."""
    llm: ChatModel = FunctionChatModel(instant_llm)
    runs = traced = None
    if tracing:
        from worker.tracing.chat_spans import TracedChatModel
        from worker.tracing.run_spans import RunTracer
        from worker.tracing.setup import open_tracing

        traced = open_tracing(worker_id="bench", capture_content=False, environ={})
        llm = TracedChatModel(llm, traced, provider="openai")
        runs = RunTracer(traced, provider="openai")
    async with throwaway_database(server_url) as url:
        await add_missions(url, count)
        async with RoundTripCounter(url) as counter:
            engine_url = url if direct else counter.url()
            engine = create_engine(engine_url, pool_size=pool, max_overflow=0)
            statements = 0

            def on_execute(*_: object) -> None:
                nonlocal statements
                statements += 1

            event.listen(engine.sync_engine, "before_cursor_execute", on_execute)
            try:
                store = PostgresMissionStore(engine)
                tools = builtin_tools(engine)
                lease = timedelta(seconds=60)
                runner = MissionRunner(
                    store=store,
                    llm=llm,
                    tools_for=lambda m: tools,
                    worker_id="bench",
                    lease=lease,
                    policy=PolicySetup(
                        default_mode="log-only",
                        config=PolicyConfig(),
                        ledger=PostgresCallLedger(engine),
                    )
                    if gate
                    else None,
                    tracing=runs,
                )
                worker = Worker(
                    store=store,
                    runner=runner,
                    worker_id="bench",
                    max_concurrent_missions=concurrency,
                    lease=lease,
                )
                started = time.perf_counter()
                await run_all(worker, url, count)
                if traced is not None:  # exporting the spans is part of the cost
                    await asyncio.to_thread(traced.shutdown)
                elapsed = time.perf_counter() - started
            finally:
                await engine.dispose()
        print(f"missions              {count}")
        print(f"concurrency           {concurrency}")
        print(f"pool                  {pool}")
        print(f"policy gate           {'log-only, PostgreSQL ledger' if gate else 'off'}")
        print(f"tracing               {'on (OTLP/HTTP)' if tracing else 'off'}")
        print(f"elapsed_s             {elapsed:.3f}")
        print(f"missions_per_s        {count / elapsed:.1f}")
        print(f"statements/mission    {statements / count:.2f}")
        if not direct:
            print(
                f"round_trips/mission   {counter.round_trips / count:.2f}  (at the wire: every "
                f"Sync and Query, {counter.connections} connection(s)' set-up included)"
            )
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--missions", type=at_least(1), default=500, help="due missions")
    parser.add_argument(
        "--concurrency", type=at_least(1), default=4, help="MANA_AI_MAX_CONCURRENT_MISSIONS"
    )
    parser.add_argument("--pool", type=at_least(1), default=10, help="MANA_AI_DB_POOL_SIZE")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="connect straight to PostgreSQL: no round-trip count, no proxy in the worker's loop",
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="the policy gate in log-only mode with its PostgreSQL ledger, as the daemon runs "
        "by default: one more statement per tool call",
    )
    parser.add_argument(
        "--tracing",
        choices=("off", "on", "both"),
        default="off",
        help="trace the runs (MANA_AI_OTEL=on) to a local OTLP endpoint; both: off, then on",
    )
    args = parser.parse_args()
    tracings = {"off": [False], "on": [True], "both": [False, True]}[args.tracing]
    with database_server() as (server_url, where), otlp_sink() as endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        print(f"database              {where}")
        rates = []
        for tracing in tracings:
            rate = asyncio.run(
                bench(
                    server_url,
                    args.missions,
                    args.concurrency,
                    args.pool,
                    args.direct,
                    args.gate,
                    tracing,
                )
            )
            rates.append(rate)
            print()
        if len(rates) == 2:
            off, on = rates
            print(
                f"tracing on / off      {on / off:.2f} of the missions per second "
                f"(+{(1 / on - 1 / off) * 1000:.2f} ms of the worker's time per mission)"
            )


if __name__ == "__main__":
    main()
