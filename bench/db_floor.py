"""A mission's database work against its floor: missions per second and worker CPU per
mission of mana-ai's tick (``bench/tick_throughput.py --direct``'s setup) beside a minimal
asyncpg script that does the least a mission needs on mana-ai's own schema, in the same
sitting.

Not a test: it prints figures. Usage::

    python bench/db_floor.py [--missions 2000] [--concurrency 4 32] [--runs 3] [--pool 10]

Database: ``MANA_AI_TEST_DATABASE_URL``'s server when set (each measurement in a fresh
database, dropped afterwards), else an embedded PostgreSQL in a temporary directory.

**The floor** (``--side floor``): ``concurrency`` tasks share an asyncpg pool of ``pool``
connections; each claims one due mission and starts its iteration in one statement (``FOR
UPDATE SKIP LOCKED``, the lease stamped, the iteration row inserted), then finishes it in
one statement (the iteration's log, rounds, tokens, reminders and status, its one
``tool_invocations`` row, the mission's next run with the lease released), until none is due.
It writes the same rows mana-ai writes: the log, the reminders and the call row are copied
from the iteration mana-ai stored for a warm-up mission in the same database, and the next
run is the cron's next hour. Nothing else: no agent, no policy settings or token use read,
no planner loop, no tool run, no statement built, no JSON encoded per mission.

**mana-ai** (``--side mana-ai``): one worker as ``bench/tick_throughput.py --direct`` wires
it (the real tick, runner, planner loop, stores and ``clock_now``; an instant in-process LLM,
two rounds; the policy gate off), claiming as the daemon does (a tick for every slot, then,
while missions are due, each run's finish for the slot it frees, and a tick on a wake-up for
what the finishes did not claim), until every mission's iteration is stored.

Each side runs a warm-up mission first (not counted), then the missions measured are added
and ``ANALYZE missions`` is run (``analyze``); each side's pool of ``pool`` connections is open
before its clock starts (``open_pool``). A measurement runs in its own process;
the sides alternate (floor first in odd runs, mana-ai first in even ones), so that a machine
shared with other work slows them alike. Figures: missions per second (wall time from the
first claim to the last finish), worker CPU per mission (``time.process_time`` of the
process over the same window), server CPU per mission (the PostgreSQL backends of the
database, from ``/proc``: the server must run on this machine, else 0), and the ratio
mana-ai / floor of missions per second, of each run's pair and of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import insert, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from bench.tick_throughput import instant_llm
from planner import ChatModel, ToolSpec
from planner.testing import FunctionChatModel
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import agents, mission_iterations, missions, tool_invocations
from worker.run.runner import MissionRunner
from worker.store.postgres import PostgresMissionStore
from worker.tools import builtin_tools

WORKER_ID = "bench"
LEASE = timedelta(seconds=60)

FLOOR_CLAIM = """
WITH due AS (
    SELECT id FROM missions
    WHERE status = 'active' AND next_run_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY next_run_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE missions SET lease_owner = $1, lease_expires_at = now() + $2::interval,
        updated_at = now()
    FROM due WHERE missions.id = due.id
    RETURNING missions.id, missions.next_run_at, missions.agent_id
)
INSERT INTO mission_iterations (mission_id, scheduled_for, status, worker_id, attempts)
SELECT id, next_run_at, 'running', $1,
    jsonb_build_array(jsonb_build_object('attempt', 1, 'worker_id', $1::text,
                                         'started_at', now()))
FROM claimed
RETURNING id, mission_id, scheduled_for
"""

FLOOR_FINISH = """
WITH owned AS (
    UPDATE missions SET next_run_at = $3, status = 'active', last_error = NULL,
        lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE id = $1 AND lease_owner = $2
    RETURNING id
), iteration AS (
    UPDATE mission_iterations SET messages = $5::jsonb, reminders = $6::jsonb, rounds = 2,
        prompt_tokens = $7, completion_tokens = $8, status = 'succeeded',
        stop_reason = 'final_answer', error = NULL, finished_at = now()
    WHERE id = $4 AND EXISTS (SELECT FROM owned)
    RETURNING id
), call AS (
    INSERT INTO tool_invocations (iteration_id, mission_id, user_id, attempt, round, position,
        call_id, tool, arguments, result, outcome, policy_mode, duration_ms)
    SELECT $4, $1, $9, 1, 1, 0, $10, 'clock_now', '{}'::jsonb, $11::jsonb, 'ok', 'off', $12
    WHERE EXISTS (SELECT FROM owned)
    RETURNING id
)
SELECT (SELECT count(*) FROM owned) AS owned
"""


async def add_missions(url: str, count: int, due: datetime) -> None:
    """``count`` missions of one agent (owner ``u0``), due at ``due``, hourly."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.begin() as conn:
            agent_id = (
                await conn.execute(select(agents.c.id).where(agents.c.name == "bench0"))
            ).scalar_one_or_none()
            if agent_id is None:
                agent_id = (
                    await conn.execute(
                        insert(agents).returning(agents.c.id),
                        {"name": "bench0", "owner_user_id": "u0", "system_prompt": "Be brief."},
                    )
                ).scalar_one()
            await conn.execute(
                insert(missions),
                [
                    {
                        "agent_id": agent_id,
                        "objective": "Tell the time.",
                        "cron": "0 * * * *",
                        "timezone": "UTC",
                        "next_run_at": due,
                    }
                    for _ in range(count)
                ],
            )
    finally:
        await engine.dispose()


async def analyze(url: str) -> None:
    """``ANALYZE missions``: the planner's statistics for the missions just added, which
    autovacuum would gather on its own within a minute of such an insert (without them each
    claim, the floor's and mana-ai's, sorts every due mission to take the first). Not the
    tables the run fills: statistics taken while they are nearly empty would say so for the
    whole run, where without any the planner goes by their size as it grows."""
    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ANALYZE missions")
    finally:
        await conn.close()


async def open_pool(engine: Any, size: int) -> None:
    """Open ``size`` connections of ``engine``'s pool and return them to it: mana-ai starts
    measured with its pool open, as the floor's (``asyncpg.create_pool(min_size=pool)``)
    is before its clock starts. A daemon's pool is open after its first busy minute; the
    warm-up mission opened one connection, and the other nine would otherwise be opened,
    and their backends' caches filled, inside the measured window."""
    fairies = [await engine.raw_connection() for _ in range(size)]
    for fairy in fairies:
        fairy.close()


class Stored:
    """Counts the iterations a worker stored; ``reached`` is set when ``target`` is met."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.reached = asyncio.Event()


def mana_ai_worker(
    url: str,
    concurrency: int,
    pool: int,
    *,
    llm: ChatModel | None = None,
    tools: list[ToolSpec] | None = None,
) -> tuple[Worker, Any, Stored]:
    """A worker wired as ``bench/tick_throughput.py --direct`` wires it, its engine, and the
    count of the iterations it stored; ``llm`` (default: ``instant_llm``) and ``tools``
    (default: the built-in tools) replace the model and the tools."""
    engine = create_engine(url, pool_size=pool, max_overflow=0)
    store = PostgresMissionStore(engine)
    stored = Stored()
    end_run = store.end_run

    async def counted(*args: Any, **kwargs: Any) -> Any:
        done = await end_run(*args, **kwargs)
        stored.count += 1
        if stored.count >= stored.target:
            stored.reached.set()
        return done

    store.end_run = counted  # type: ignore[method-assign]
    offered = tools if tools is not None else builtin_tools(engine)
    runner = MissionRunner(
        store=store,
        llm=llm or FunctionChatModel(instant_llm),
        tools_for=lambda m: offered,
        worker_id=WORKER_ID,
        lease=LEASE,
    )
    worker = Worker(
        store=store,
        runner=runner,
        worker_id=WORKER_ID,
        max_concurrent_missions=concurrency,
        lease=LEASE,
    )
    return worker, engine, stored


async def run_mana_ai(worker: Worker, stored: Stored, count: int) -> float:
    """Run the daemon's tick loop until ``count`` more iterations are stored; seconds."""
    stored.target = stored.count + count
    stored.reached.clear()
    worker.stopping = False
    started = time.perf_counter()
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, 3600)
    scheduler.start()
    await stored.reached.wait()
    elapsed = time.perf_counter() - started
    await worker.drain(60)
    scheduler.shutdown(wait=False)
    return elapsed


async def floor_payload(url: str) -> dict[str, Any]:
    """What mana-ai stored for its warm-up mission: the log, reminders, tokens, the call."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:
            it = (await conn.execute(select(mission_iterations))).mappings().one()
            call = (await conn.execute(select(tool_invocations))).mappings().one()
    finally:
        await engine.dispose()
    return {
        "messages": json.dumps(it["messages"]),
        "reminders": json.dumps(it["reminders"]),
        "prompt_tokens": it["prompt_tokens"],
        "completion_tokens": it["completion_tokens"],
        "call_id": call["call_id"],
        "result": json.dumps(call["result"]),
        "duration_ms": call["duration_ms"],
    }


async def run_floor(
    url: str, count: int, concurrency: int, pool_size: int
) -> tuple[float, dict[int, float]]:
    """The floor's run: its seconds, and its backends' CPU at the end (``backend_cpu``)."""
    payload = await floor_payload(url)
    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    pool = await asyncpg.create_pool(dsn, min_size=pool_size, max_size=pool_size)
    done = 0

    async def one_task() -> None:
        nonlocal done
        while True:
            async with pool.acquire() as conn:
                row = await conn.fetchrow(FLOOR_CLAIM, WORKER_ID, LEASE)
            if row is None:
                return
            iteration_id, mission_id, scheduled_for = row
            async with pool.acquire() as conn:
                await conn.fetchval(
                    FLOOR_FINISH,
                    mission_id,
                    WORKER_ID,
                    scheduled_for + timedelta(hours=1),
                    iteration_id,
                    payload["messages"],
                    payload["reminders"],
                    payload["prompt_tokens"],
                    payload["completion_tokens"],
                    "u0",
                    payload["call_id"],
                    payload["result"],
                    payload["duration_ms"],
                )
            done += 1

    try:
        started = time.perf_counter()
        await asyncio.gather(*(one_task() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        after = await backend_cpu(url)
    finally:
        await pool.close()
    if done != count:
        raise SystemExit(f"the floor finished {done} missions, not {count}")
    return elapsed, after


async def backend_cpu(url: str) -> dict[int, float]:
    """CPU seconds (user + system) so far of each PostgreSQL backend connected to ``url``'s
    database but the one asking (read from ``/proc``: the server runs on this machine)."""
    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    conn = await asyncpg.connect(dsn)
    try:
        pids = await conn.fetch(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return await asyncio.to_thread(_proc_cpu, [pid for (pid,) in pids])


def _proc_cpu(pids: list[int]) -> dict[int, float]:
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # another machine's server, or the backend ended
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu


async def measure(side: str, server_url: str, count: int, concurrency: int, pool: int) -> None:
    """One measurement in a fresh database; prints one JSON line."""
    async with throwaway_database(server_url) as url:
        engine = create_engine(url, pool_size=1, max_overflow=0)
        try:
            await upgrade_database(engine)
        finally:
            await engine.dispose()
        now = datetime.now(UTC)
        await add_missions(url, 1, now - timedelta(seconds=2))  # the warm-up mission
        worker, worker_engine, stored = mana_ai_worker(url, concurrency, pool)
        try:
            await run_mana_ai(worker, stored, 1)
            await add_missions(url, count, now - timedelta(seconds=1))
            await analyze(url)
            if side == "floor":
                await worker_engine.dispose()
            else:
                await open_pool(worker_engine, pool)
            before = await backend_cpu(url)
            cpu = time.process_time()
            if side == "floor":
                elapsed, after = await run_floor(url, count, concurrency, pool)
            else:
                elapsed = await run_mana_ai(worker, stored, count)
                after = await backend_cpu(url)
            cpu = time.process_time() - cpu
            server = sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())
        finally:
            await worker_engine.dispose()
    figures = {
        "missions_per_s": count / elapsed,
        "cpu_ms_per_mission": 1000 * cpu / count,
        "server_cpu_ms_per_mission": 1000 * server / count,
    }
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--missions", type=at_least(1), default=2000, help="missions per run")
    parser.add_argument(
        "--concurrency", type=at_least(1), nargs="+", default=[4, 32], help="missions at once"
    )
    parser.add_argument("--runs", type=at_least(1), default=3, help="pairs per concurrency")
    parser.add_argument("--pool", type=at_least(1), default=10, help="database connections")
    parser.add_argument("--side", choices=("floor", "mana-ai"), help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # one measurement, in this process (the parent runs these)
        asyncio.run(
            measure(
                args.side,
                args.server,
                args.missions,
                args.concurrency[0],
                args.pool,
            )
        )
        return
    with database_server() as (server_url, where):
        print(f"database              {where}")
        print(f"missions              {args.missions} per run, pool {args.pool}")
        for concurrency in args.concurrency:
            figures: dict[str, list[dict[str, float]]] = {"floor": [], "mana-ai": []}
            for run in range(args.runs):
                order = ("floor", "mana-ai") if run % 2 == 0 else ("mana-ai", "floor")
                for side in order:
                    figures[side].append(one_process(side, server_url, args, concurrency))
                floor, ours = figures["floor"][-1], figures["mana-ai"][-1]
                print(
                    f"concurrency {concurrency:3} run {run + 1}: floor "
                    f"{floor['missions_per_s']:6.0f}/s {floor['cpu_ms_per_mission']:.2f} ms CPU "
                    f"(server {floor['server_cpu_ms_per_mission']:.2f}); "
                    f"mana-ai {ours['missions_per_s']:6.0f}/s "
                    f"{ours['cpu_ms_per_mission']:.2f} ms CPU "
                    f"(server {ours['server_cpu_ms_per_mission']:.2f}); ratio "
                    f"{ours['missions_per_s'] / floor['missions_per_s']:.2f}",
                    flush=True,
                )
            print(summary(concurrency, figures), flush=True)


def one_process(
    side: str, server: str, args: argparse.Namespace, concurrency: int
) -> dict[str, float]:
    """One measurement in a fresh process (``--side``); its figures."""
    argv = [sys.executable, __file__, "--side", side, "--server", server]
    argv += ["--missions", str(args.missions), "--concurrency", str(concurrency)]
    argv += ["--pool", str(args.pool)]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed: {done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def summary(concurrency: int, figures: dict[str, list[dict[str, float]]]) -> str:
    def span(side: str, key: str, digits: int) -> str:
        values = [f[key] for f in figures[side]]
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    def median(side: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[side])

    ratios = [
        ours["missions_per_s"] / floor["missions_per_s"]
        for floor, ours in zip(figures["floor"], figures["mana-ai"], strict=True)
    ]
    return (
        f"concurrency {concurrency:3}: floor {span('floor', 'missions_per_s', 0)}/s "
        f"({span('floor', 'cpu_ms_per_mission', 2)} ms worker CPU, "
        f"{span('floor', 'server_cpu_ms_per_mission', 2)} ms server CPU), mana-ai "
        f"{span('mana-ai', 'missions_per_s', 0)}/s ({span('mana-ai', 'cpu_ms_per_mission', 2)} "
        f"ms worker CPU, {span('mana-ai', 'server_cpu_ms_per_mission', 2)} ms server CPU); "
        f"ratio per run {min(ratios):.2f}-{max(ratios):.2f}, of the medians "
        f"{median('mana-ai', 'missions_per_s') / median('floor', 'missions_per_s'):.2f}"
    )


if __name__ == "__main__":
    main()
