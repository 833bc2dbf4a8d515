"""Durable runs: mana-ai's worker against LangGraph with its PostgreSQL checkpointer, in the
same sitting, on the same PostgreSQL server: runs per second, client CPU and server CPU per
run, and the ratio of runs per second.

Not a test: it prints figures. Usage::

    python bench/durable.py [--runs 200] [--rounds 3] [--concurrency 20] [--pool 10]
                            [--sittings 2] [--peers-venv .venv-peers]

Both sides run the same script with an instant model: ``rounds - 1`` rounds that each call one
tool, then an answer; ``runs`` runs overlap up to ``concurrency`` on a pool of ``pool``
connections opened before the clock starts, each side in a process and a fresh database of
its own, the sides alternating per sitting. What each stores so that a crash loses no step:

* **mana-ai** (this tree): the real worker (``bench/db_floor.py``'s wiring: APScheduler tick,
  runner, planner loop, PostgreSQL store) on missions whose tool is a ``write`` (a no-op
  handler): its journal stores the round and the call's ``started`` row before the call
  runs and its outcome after, and the finish stores the run and moves the schedule; the
  claims that start the runs are counted too.
* **LangGraph** (``bench/durable_langgraph.py``, in the peers' environment made on first
  use with ``PEER_REQUIREMENTS``): the canonical tool-calling graph compiled with
  ``AsyncPostgresSaver``, ``durability="sync"`` (each step's checkpoint written before the
  next step runs), one thread per run.

Database: ``MANA_AI_TEST_DATABASE_URL``'s server when set, else an embedded PostgreSQL.
Server CPU is read from ``/proc`` (the server must run on this machine, else 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.common import at_least, database_server, throwaway_database
from bench.db_floor import add_missions, backend_cpu, mana_ai_worker, open_pool, run_mana_ai
from planner import CompletionRequest, CompletionResponse, ToolContext, ToolSpec
from planner.testing import FunctionChatModel, final_answer, tool_calls
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database

ROOT = Path(__file__).resolve().parent.parent
PEER_REQUIREMENTS = (
    "langgraph>=1.2,<2",
    "langchain-core>=1.8,<2",
    "langgraph-checkpoint-postgres>=3,<4",
    "psycopg[binary]>=3.2,<4",
    "psycopg-pool>=3.2,<4",
)


async def _step(args: dict[str, Any], ctx: ToolContext) -> dict[str, bool]:
    return {"ok": True}


STEP = ToolSpec(
    "step",
    "Records one step (does nothing).",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "write",
    _step,
)


def scripted(rounds: int) -> Any:
    """The model: ``rounds - 1`` rounds calling ``step``, then an answer."""

    def reply(request: CompletionRequest) -> CompletionResponse:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done >= rounds - 1:
            return final_answer("done")
        return tool_calls(("step", {"text": f"step {done + 1}"}))

    return reply


async def mana_ai_side(server: str, runs: int, rounds: int, concurrency: int, pool: int) -> dict:
    async with throwaway_database(server) as url:
        migrator = create_engine(url, pool_size=1, max_overflow=0)
        try:
            await upgrade_database(migrator)
        finally:
            await migrator.dispose()
        worker, engine, stored = mana_ai_worker(
            url, concurrency, pool, llm=FunctionChatModel(scripted(rounds)), tools=[STEP]
        )
        try:
            now = datetime.now(UTC)
            await add_missions(url, 1, now - timedelta(seconds=2))
            await run_mana_ai(worker, stored, 1)  # warm-up, not counted
            await add_missions(url, runs, now - timedelta(seconds=1))
            await open_pool(engine, pool)
            before = await backend_cpu(url)
            cpu = time.process_time()
            elapsed = await run_mana_ai(worker, stored, runs)
            cpu = time.process_time() - cpu
            after = await backend_cpu(url)
        finally:
            await engine.dispose()
    server_s = sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())
    return {
        "runs_per_s": runs / elapsed,
        "cpu_ms_per_run": 1000 * cpu / runs,
        "server_cpu_ms_per_run": 1000 * server_s / runs,
    }


def peers_python(venv: Path) -> Path:
    """The peers' interpreter, the environment made and filled first when it lacks them."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = "import langgraph.checkpoint.postgres.aio, psycopg_pool"
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode != 0:
        print(f"filling the peers' environment {venv}: pip install {' '.join(PEER_REQUIREMENTS)}")
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
    return python


def one_side(side: str, argv: list[str], python: Path) -> dict[str, Any]:
    done = subprocess.run([str(python), *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed: {done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figures


async def langgraph_side(server: str, python: Path, args: argparse.Namespace) -> dict[str, Any]:
    async with throwaway_database(server, "langgraph_bench") as url:
        dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
        argv = [str(ROOT / "bench" / "durable_langgraph.py"), "--dsn", dsn]
        argv += ["--runs", str(args.runs), "--rounds", str(args.rounds)]
        argv += ["--concurrency", str(args.concurrency), "--pool", str(args.pool)]
        return await asyncio.to_thread(one_side, "LangGraph", argv, python)


def ours(server: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [__file__, "--side", "mana-ai", "--server", server, "--runs", str(args.runs)]
    argv += ["--rounds", str(args.rounds), "--concurrency", str(args.concurrency)]
    argv += ["--pool", str(args.pool)]
    return one_side("mana-ai", argv, Path(sys.executable))


def line(name: str, f: dict[str, Any]) -> str:
    return (
        f"{name:10} {f['runs_per_s']:7.1f} runs/s  {f['cpu_ms_per_run']:6.2f} ms CPU/run  "
        f"server {f['server_cpu_ms_per_run']:6.2f} ms/run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=at_least(1), default=200)
    parser.add_argument("--rounds", type=at_least(2), default=3, help="model requests a run")
    parser.add_argument("--concurrency", type=at_least(1), default=20)
    parser.add_argument("--pool", type=at_least(1), default=10)
    parser.add_argument("--sittings", type=at_least(1), default=2)
    parser.add_argument("--peers-venv", type=Path, default=ROOT / ".venv-peers")
    parser.add_argument("--side", choices=("mana-ai",), help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        figures = asyncio.run(
            mana_ai_side(args.server, args.runs, args.rounds, args.concurrency, args.pool)
        )
        print(json.dumps(figures))
        return
    python = peers_python(args.peers_venv)
    ratios = []
    with database_server() as (server, where):
        print(f"database {where}; {args.runs} runs x {args.rounds} requests, ", end="")
        print(f"concurrency {args.concurrency}, pool {args.pool}")
        for sitting in range(args.sittings):
            lg = asyncio.run(langgraph_side(server, python, args))
            ma = ours(server, args)
            print(f"sitting {sitting + 1}: {line('mana-ai', ma)}")
            print(f"sitting {sitting + 1}: {line('LangGraph', lg)}")
            ratios.append(ma["runs_per_s"] / lg["runs_per_s"])
        print(f"peers: {lg['versions']}")
    print(
        f"mana-ai / LangGraph, runs per second: {min(ratios):.1f}-{max(ratios):.1f}x "
        f"(median {statistics.median(ratios):.1f}x)"
    )


if __name__ == "__main__":
    main()
