"""Tick throughput: missions per second for one worker with an instant fake LLM, and the
database round trips each mission costs.

Not a test: it prints figures. Usage::

    python bench/tick_throughput.py [--missions 500] [--concurrency 4]

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a fresh database is created in that server
and dropped afterwards), else an embedded PostgreSQL in a temporary directory.

Each mission runs two rounds (one ``clock_now`` tool call, then a final answer) through the
real tick, runner, stores and built-in tools; only the LLM is instant (in-process). Round trips
are counted with a SQLAlchemy ``before_cursor_execute`` listener (one per statement), plus one
BEGIN and one COMMIT per transaction, which asyncpg sends as separate messages.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import event, make_url, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import CompletionRequest, CompletionResponse
from planner.testing import FunctionChatModel, final_answer, tool_calls
from worker.db.admin import AdminStore
from worker.db.engine import create_engine, start_embedded_postgres, to_async_url
from worker.db.migrate import upgrade_database
from worker.db.stores import MissionStore
from worker.runner import MissionRunner
from worker.tick import Worker
from worker.tools import builtin_tools


def instant_llm(request: CompletionRequest) -> CompletionResponse:
    if any(m.role == "tool" for m in request.messages):
        return final_answer("done")
    return tool_calls(("clock_now", {}))


async def bench(server_url: str, missions: int, concurrency: int) -> None:
    name = f"mana_ai_bench_{uuid.uuid4().hex[:8]}"
    admin_engine = create_engine(server_url)
    async with admin_engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url, pool_size=concurrency + 2)
    try:
        await upgrade_database(engine)
        admin = AdminStore(engine)
        agent = await admin.add_agent(name="bench", owner_user_id="u", system_prompt="Be brief.")
        now = datetime.now(UTC) - timedelta(seconds=1)
        for _ in range(missions):
            await admin.add_mission(
                agent_id=agent["id"],
                objective="Tell the time.",
                cron="0 * * * *",
                timezone="UTC",
                next_run_at=now,
            )
        store = MissionStore(engine)
        tools = builtin_tools(engine)
        lease = timedelta(seconds=60)
        runner = MissionRunner(
            store=store,
            llm=FunctionChatModel(instant_llm),
            tools_for=lambda m: tools,
            worker_id="bench",
            lease=lease,
        )
        worker = Worker(
            store=store,
            runner=runner,
            worker_id="bench",
            max_concurrent_missions=concurrency,
            lease=lease,
        )
        counts = {"statements": 0, "transactions": 0}

        def on_execute(*_: object) -> None:
            counts["statements"] += 1

        def on_begin(*_: object) -> None:
            counts["transactions"] += 1

        event.listen(engine.sync_engine, "before_cursor_execute", on_execute)
        event.listen(engine.sync_engine, "begin", on_begin)
        started = time.perf_counter()
        ticks = 0
        done = 0
        while done < missions:
            outcomes = await worker.run_once()
            ticks += 1
            done += len(outcomes)
            if not outcomes:
                raise RuntimeError("a tick ran nothing before all missions were done")
        elapsed = time.perf_counter() - started
        round_trips = counts["statements"] + 2 * counts["transactions"]
        print(f"missions            {missions}")
        print(f"concurrency         {concurrency}")
        print(f"ticks               {ticks}")
        print(f"elapsed_s           {elapsed:.3f}")
        print(f"missions_per_s      {missions / elapsed:.1f}")
        print(f"statements/mission  {counts['statements'] / missions:.2f}")
        print(f"transactions/mission {counts['transactions'] / missions:.2f}")
        print(f"round_trips/mission {round_trips / missions:.2f}  (statements + BEGIN/COMMIT)")
    finally:
        await engine.dispose()
        async with admin_engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin_engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--missions", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    url = os.environ.get("MANA_AI_TEST_DATABASE_URL")
    with tempfile.TemporaryDirectory(prefix="mana-ai-bench-") as tmp:
        Path(tmp).chmod(0o755)  # as root the embedded server's user must enter it
        if url:
            server_url = to_async_url(url)
            where = "MANA_AI_TEST_DATABASE_URL"
        else:
            server_url = start_embedded_postgres(Path(tmp) / "pgdata", cleanup_mode="delete")
            where = "embedded PostgreSQL"
        print(f"database            {where}")
        asyncio.run(bench(server_url, args.missions, args.concurrency))


if __name__ == "__main__":
    main()
