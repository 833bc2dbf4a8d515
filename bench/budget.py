"""The performance budget at a realistic model latency (``docs/performance.md``): a real
``mana-ai worker`` process runs N missions of R write rounds against a fake model that answers
each request after a latency drawn from a range, and its wall is set beside that of a worker
with no overhead (the same latencies, only sleeping, with the same concurrency).

    python bench/budget.py [--missions 200] [--rounds 3] [--llm-latency-ms 500-1500]
                           [--concurrency 50] [--tree DIR ...]

Each mission belongs to its own agent and user (one user's rate limit would otherwise be the
bottleneck); each of its first R rounds calls ``notes_create`` (a journaled write: its start and
outcome are stored), then it answers. The latency of mission m's round r is drawn from
``--llm-latency-ms`` (``LO-HI`` uniform, or one value) by a generator seeded with ``(seed, m, r)``,
so every tree and the ideal see the same latencies. The fake model runs in its own process.

Per tree (``--tree``: a source tree, default this one; give two to compare an old tree in its
own worktree with this one, run alternately in one sitting), it prints:

* ``wall``: the first iteration's start to the last one's finish (database clock), and
  ``ratio`` = wall / ideal, the ideal being the same missions in the same order on
  ``--concurrency`` slots that only sleep their latencies (budget: <= 1.10 at 0.5-1.5 s, c50;
  <= 1.25 at 1 s with >= 100 in flight per core);
* ``cpu/mission``: the worker process's CPU (user + system, from ``/proc``) while it ran them,
  divided by the missions, and that as a share of a mission's own mean wall (budget: <= 2 %);
* ``cores``: the worker's CPU over the wall (1.0 = one core busy), and how many missions in
  flight a core carries before CPU binds (a mission's mean wall / its CPU).

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a throw-away database in that server), else
an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from tests.fakes.async_llm_server import AsyncLLMServer
from tests.fakes.llm_server import chat_completion_body

ROOT = Path(__file__).resolve().parent.parent
MISSION = re.compile(r"Mission (\d+)\.")


@dataclass(frozen=True)
class Latency:
    """Seconds a request waits: uniform in ``[low, high]`` by a generator seeded per request."""

    low: float
    high: float
    seed: int = 1

    def of(self, mission: int, round_: int) -> float:
        return random.Random(f"{self.seed}:{mission}:{round_}").uniform(self.low, self.high)


def parse_latency(text: str) -> Latency:
    """``500-1500`` or ``1000`` (milliseconds) as a ``Latency``; else a usage error."""
    low, _, high = text.partition("-")
    try:
        lo, hi = float(low) / 1000, float(high or low) / 1000
    except ValueError:
        raise argparse.ArgumentTypeError(f"not LO-HI or a number of ms: {text!r}") from None
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"need 0 <= LO <= HI, got {text!r}")
    return Latency(lo, hi)


def _mission_and_round(body: dict[str, Any]) -> tuple[int, int]:
    messages = body.get("messages", [])
    text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    found = MISSION.search(text)
    return (int(found.group(1)) if found else 0), sum(m.get("role") == "tool" for m in messages)


def serve_model(latency: Latency, rounds: int, connection: Any) -> None:
    """The fake model, in its own process: R ``notes_create`` calls, then an answer."""

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        mission, round_ = _mission_and_round(body)
        if round_ < rounds:
            title = f"m{mission} r{round_}"
            return chat_completion_body(tool_calls=[("notes_create", {"title": title})])
        return chat_completion_body(content="Noted.")

    async def serve() -> None:
        server = AsyncLLMServer(lambda b: latency.of(*_mission_and_round(b)), respond)
        async with server:
            connection.send(server.port)
            await asyncio.Event().wait()

    asyncio.run(serve())


async def ideal_wall(missions: int, rounds: int, latency: Latency, concurrency: int) -> float:
    """The wall of a worker with no overhead: the missions in order on ``concurrency`` slots,
    each sleeping its R + 1 latencies."""
    slots = asyncio.Semaphore(concurrency)

    async def one(mission: int) -> None:
        async with slots:
            for round_ in range(rounds + 1):
                await asyncio.sleep(latency.of(mission, round_))

    start = time.monotonic()
    await asyncio.gather(*(one(m) for m in range(1, missions + 1)))
    return time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _add_missions(dsn: str, missions: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            ids = await conn.fetch(
                "INSERT INTO agents (name, owner_user_id, system_prompt) "
                "SELECT 'bench' || g, 'u' || g, 'Take notes.' FROM generate_series(1, $1) g "
                "RETURNING id",
                missions,
            )
            await conn.executemany(
                "INSERT INTO missions (agent_id, objective, cron, timezone, next_run_at) "
                "VALUES ($1, $2, '0 0 1 1 *', 'UTC', now() - interval '1 second')",
                [(r["id"], f"Mission {n}. Take notes.") for n, r in enumerate(ids, 1)],
            )
    finally:
        await conn.close()


async def _finished(dsn: str) -> tuple[int, float, float]:
    """Finished iterations, the span from the first start to the last finish (s), and the
    mean of their own walls (s)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, extract(epoch FROM max(finished_at) - min(started_at)) AS span,"
            " avg(extract(epoch FROM finished_at - started_at)) AS mean "
            "FROM mission_iterations WHERE finished_at IS NOT NULL"
        )
        failed = await conn.fetchval(
            "SELECT count(*) FROM mission_iterations "
            "WHERE finished_at IS NOT NULL AND status <> 'succeeded'"
        )
    finally:
        await conn.close()
    if failed:
        raise SystemExit(f"{failed} iterations did not succeed: see the worker's log")
    return int(row["n"]), float(row["span"] or 0), float(row["mean"] or 0)


@dataclass
class Figures:
    wall: float
    cpu: float
    mission_wall: float


async def run_tree(
    tree: Path, server: str, model_url: str, missions: int, concurrency: int
) -> Figures:
    """One sitting of one tree: a fresh database, a worker process on it, the missions."""
    async with throwaway_database(server) as url:
        dsn = url.replace("postgresql+asyncpg://", "postgresql://")
        port = _free_port()
        env = os.environ | {
            "PYTHONPATH": str(tree),
            "MANA_AI_DATABASE_URL": url,
            "MANA_AI_LLM_BASE_URL": model_url,
            "MANA_AI_LLM_MODEL": "bench",
            "MANA_AI_MAX_CONCURRENT_MISSIONS": str(concurrency),
            "MANA_AI_TICK_INTERVAL_S": "1",
            "MANA_AI_METRICS_PORT": str(port),
            "MANA_AI_LOG_LEVEL": os.environ.get("MANA_AI_LOG_LEVEL", "WARNING"),
        }
        cli = [sys.executable, "-m", "worker.cli"]
        upgrade = await asyncio.create_subprocess_exec(*cli, "db", "upgrade", env=env, cwd=tree)
        if await upgrade.wait():
            raise SystemExit(f"mana-ai db upgrade failed in {tree}")
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"budget-{port}.log"
        proc = await asyncio.to_thread(_start_worker, [*cli, "worker"], env, tree, log)
        try:
            await _until_up(port, proc)
            cpu_before = _cpu_s(proc.pid)
            await _add_missions(dsn, missions)
            while (done := await _finished(dsn))[0] < missions:
                if proc.poll() is not None:
                    raise SystemExit(f"the worker exited ({proc.returncode}): {log}")
                await asyncio.sleep(0.2)
            cpu = _cpu_s(proc.pid) - cpu_before
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 30)
        return Figures(wall=done[1], cpu=cpu, mission_wall=done[2])


def _start_worker(
    argv: list[str], env: dict[str, str], tree: Path, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=tree)


def _healthy(port: int) -> None:
    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()


async def _until_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"the worker exited ({proc.returncode}) before it was up")
        try:
            await asyncio.to_thread(_healthy, port)
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit("the worker was not up in 60 s")


def report(tree: Path, f: Figures, ideal: float, missions: int) -> None:
    per_mission = f.cpu / missions
    print(
        f"{tree!s:<28} wall {f.wall:6.2f} s  ideal {ideal:6.2f} s  ratio {f.wall / ideal:5.3f}"
        f"  cpu/mission {per_mission * 1000:6.1f} ms = {per_mission / f.mission_wall:6.2%} of "
        f"its {f.mission_wall:5.2f} s  cores {f.cpu / f.wall:4.2f}  in flight/core before "
        f"CPU binds ~{f.mission_wall / per_mission:,.0f}"
    )


async def bench(args: argparse.Namespace) -> None:
    parent, child = multiprocessing.Pipe()
    model = multiprocessing.get_context("spawn").Process(
        target=serve_model, args=(args.llm_latency_ms, args.rounds, child), daemon=True
    )
    model.start()
    model_url = f"http://127.0.0.1:{parent.recv()}/v1"
    try:
        with database_server() as (server, where):
            lat = args.llm_latency_ms
            print(
                f"{args.missions} missions x {args.rounds} write rounds, model latency "
                f"{lat.low:.2f}-{lat.high:.2f} s, concurrency {args.concurrency}, {where}, "
                f"{os.cpu_count()} cores"
            )
            ideal = await ideal_wall(args.missions, args.rounds, lat, args.concurrency)
            figures: dict[Path, list[Figures]] = {t: [] for t in args.tree}
            for _ in range(args.sittings):
                for tree in args.tree:
                    f = await run_tree(tree, server, model_url, args.missions, args.concurrency)
                    figures[tree].append(f)
                    report(tree, f, ideal, args.missions)
            if args.sittings > 1:
                print("medians:")
                for tree, runs in figures.items():
                    median = Figures(
                        statistics.median(r.wall for r in runs),
                        statistics.median(r.cpu for r in runs),
                        statistics.median(r.mission_wall for r in runs),
                    )
                    report(tree, median, ideal, args.missions)
    finally:
        model.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--missions", type=at_least(1), default=200)
    parser.add_argument("--rounds", type=at_least(0), default=3, help="write rounds a mission")
    parser.add_argument(
        "--llm-latency-ms",
        type=parse_latency,
        default=parse_latency("500-1500"),
        help="the model's latency per request: LO-HI (uniform) or one value, in ms",
    )
    parser.add_argument("--concurrency", type=at_least(1), default=50)
    parser.add_argument("--sittings", type=at_least(1), default=1, help="runs of each tree")
    parser.add_argument(
        "--tree", type=Path, action="append", help="a source tree to run (repeatable)"
    )
    args = parser.parse_args()
    args.tree = [t.resolve() for t in (args.tree or [ROOT])]
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
