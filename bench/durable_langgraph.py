"""LangGraph's durable runs, for ``bench/durable.py``: runs per second of the canonical
tool-calling graph (a model node, ``ToolNode``, ``tools_condition``) with LangGraph's
PostgreSQL checkpointer (``AsyncPostgresSaver`` on a ``psycopg_pool.AsyncConnectionPool``),
every step's checkpoint written before the next step starts (``durability="sync"``: what a
run must have stored to resume after a crash at that step).

Runs in the peers' own virtual environment (``bench/durable.py`` fills it), never in
mana-ai's: it imports nothing of mana-ai. Its database is made empty by the caller; the
checkpointer's tables are set up before the clock starts. Prints one JSON object:
``{"runs_per_s", "cpu_ms_per_run", "server_cpu_ms_per_run", "versions"}``.

The model replays, per run, ``rounds - 1`` replies that each call one no-op tool, then an
answer (``bench/peers_langgraph.py``'s script); runs overlap up to ``--concurrency``, each its
own thread (``thread_id``), on a pool of ``--pool`` connections opened before the clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from importlib.metadata import version
from pathlib import Path

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from peers_langgraph import ReplayChatModel, graph, noop_tool, script
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool


async def backend_cpu(pool: AsyncConnectionPool) -> float:
    """CPU seconds so far of the PostgreSQL backends connected to the pool's database but the
    one asking (``/proc``: the server runs on this machine)."""
    async with pool.connection() as conn:
        rows = await (
            await conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).fetchall()
    return await asyncio.to_thread(_proc_cpu, [row["pid"] for row in rows])


def _proc_cpu(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def measure(dsn: str, runs: int, rounds: int, concurrency: int, pool_size: int) -> dict:
    tools = [noop_tool(0)]
    replies = script(rounds, 1)
    async with AsyncConnectionPool(
        dsn,
        min_size=pool_size,
        max_size=pool_size,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
    ) as pool:
        await pool.wait()
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        slots = asyncio.Semaphore(concurrency)

        async def one(n: int) -> None:
            model = ReplayChatModel(replies=replies)
            app = graph(model, tools, checkpointer=saver)
            async with slots:
                result = await app.ainvoke(
                    {"messages": [("system", "You are a benchmark."), ("user", "Go.")]},
                    {"configurable": {"thread_id": f"run-{n}"}, "recursion_limit": 4 * rounds},
                    durability="sync",
                )
            assert result["messages"][-1].content == "done", result["messages"][-1]

        await one(-1)  # warm-up, not counted
        server = await backend_cpu(pool)
        cpu = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(runs)))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        server = await backend_cpu(pool) - server
    return {
        "runs_per_s": runs / elapsed,
        "cpu_ms_per_run": 1000 * cpu / runs,
        "server_cpu_ms_per_run": 1000 * server / runs,
        "versions": {
            name: version(name)
            for name in ("langgraph", "langgraph-checkpoint-postgres", "psycopg")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--pool", type=int, default=10)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.dsn, args.runs, args.rounds, args.concurrency, args.pool))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
