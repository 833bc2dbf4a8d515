"""Wake-up latency: from adding a mission due now to its iteration started, with the default
30 s tick.

Not a test: it prints figures. Usage::

    python bench/wakeup.py [--samples 20] [--cli]

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a fresh database is created in that server
and dropped afterwards), else an embedded PostgreSQL in a temporary directory.

One worker runs in-process through the daemon's own ``serve()`` (tick loop, wake-up listener,
default ``MANA_AI_TICK_INTERVAL_S`` of 30 s, metrics off) with an instant fake LLM. Each
sample adds a one-shot mission due now, with ``AdminStore.add_mission`` (what ``mana-ai
missions add`` calls) or, with ``--cli``, by running ``mana-ai missions add --due-now`` as a
process; the clock starts when that returns and stops when the mission's iteration row is
seen (polled every 2 ms on a connection of its own). Without wake-ups the expected wait is half
the tick interval (15 s) and the worst a whole one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from bench.tick_throughput import instant_llm
from planner.testing import FunctionChatModel
from worker.daemon.serve import serve
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import mission_iterations
from worker.queries.missions import AdminStore
from worker.settings import Settings


class _Seen(logging.Handler):
    """Sets ``event`` when a log line starts with ``prefix``."""

    def __init__(self, prefix: str, event: asyncio.Event) -> None:
        super().__init__(logging.INFO)
        self.prefix = prefix
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()


async def _add_with_cli(url: str, objective: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MANA_AI_")}
    env["MANA_AI_DATABASE_URL"] = url
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        "missions",
        "add",
        "--agent",
        "bench",
        "--objective",
        objective,
        "--due-now",
        "--json",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"mana-ai missions add failed: {err.decode()}")
    return int(json.loads(out)["id"])


async def _started(probe: AsyncEngine, mission_id: int) -> None:
    query = select(mission_iterations.c.id).where(mission_iterations.c.mission_id == mission_id)
    async with probe.connect() as conn:
        while (await conn.execute(query)).first() is None:
            await conn.rollback()
            await asyncio.sleep(0.002)


async def bench(server_url: str, samples: int, via_cli: bool) -> None:
    async with throwaway_database(server_url) as url:
        await measure(url, samples, via_cli)


async def measure(url: str, samples: int, via_cli: bool) -> None:
    engine = create_engine(url, pool_size=2)
    try:
        await upgrade_database(engine)
        admin = AdminStore(engine)
        agent = await admin.add_agent(name="bench", owner_user_id="u", system_prompt="Be brief.")
        settings = Settings(database_url=url, metrics_port=0, worker_id="bench")
        listening = asyncio.Event()
        logging.getLogger("worker.daemon.wakeup").setLevel(logging.INFO)
        logging.getLogger("worker.daemon.wakeup").addHandler(
            _Seen("wake-ups: listening", listening)
        )
        stop = asyncio.Event()
        daemon = asyncio.create_task(serve(settings, llm=FunctionChatModel(instant_llm), stop=stop))
        try:
            async with asyncio.timeout(60):
                await listening.wait()
            await asyncio.sleep(1.0)  # the start-up tick is over; the next is 30 s away
            latencies: list[float] = []
            for n in range(samples):
                if via_cli:
                    mission_id = await _add_with_cli(url, f"sample {n}")
                else:
                    row = await admin.add_mission(
                        agent_id=agent["id"],
                        objective=f"sample {n}",
                        cron=None,
                        timezone="UTC",
                        next_run_at=datetime.now(UTC),
                    )
                    mission_id = int(row["id"])
                begun = time.perf_counter()
                async with asyncio.timeout(settings.daemon.tick_interval_s * 2):
                    await _started(engine, mission_id)
                latencies.append(time.perf_counter() - begun)
                await asyncio.sleep(0.1)  # let the run finish; samples do not overlap
        finally:
            stop.set()
            await daemon
        ms = sorted(1000 * s for s in latencies)
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        print(
            f"added via           {'mana-ai missions add --due-now' if via_cli else 'AdminStore'}"
        )
        print(f"tick_interval_s     {settings.daemon.tick_interval_s:g}")
        print(f"samples             {len(ms)}")
        print(f"median_ms           {statistics.median(ms):.1f}")
        print(f"p95_ms              {p95:.1f}")
        print(f"max_ms              {ms[-1]:.1f}")
        print(
            f"without wake-ups    ~{settings.daemon.tick_interval_s / 2 * 1000:.0f} ms on average"
        )
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--samples", type=at_least(1), default=20, help="missions added, one at a time"
    )
    parser.add_argument(
        "--cli", action="store_true", help="add each mission with `mana-ai missions add`"
    )
    args = parser.parse_args()
    with database_server() as (server_url, where):
        print(f"database            {where}")
        asyncio.run(bench(server_url, args.samples, args.cli))


if __name__ == "__main__":
    main()
