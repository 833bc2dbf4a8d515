"""Concurrency: N missions at once on one worker, a slow LLM over real HTTP, few connections.

Not a test: it prints figures. Usage::

    python bench/concurrency.py [--missions 1000] [--latency 1.0] [--concurrency 500]
                                [--pool 10] [--overflow 0] [--policy-mode enforce]

A fake OpenAI-compatible server in a child process (``tests.fakes.async_llm_server``:
asyncio, HTTP/1.1 keep-alive) answers every request after ``--latency`` seconds: a
``clock_now`` call first, then a final answer, so each mission makes 2 requests. One
worker, wired from settings exactly as ``mana-ai worker`` is (``worker.daemon.app.open_app``: pool
``MANA_AI_DB_POOL_SIZE`` / ``MANA_AI_DB_MAX_OVERFLOW``, the OpenAI-compatible client, the
policy gate), ticks once and then on every wake-up (a freed slot while missions wait), until
every iteration finished. Each mission belongs to its own user, as in a real deployment
(one user's 30-calls-a-minute rate limit would otherwise be the bottleneck).

Prints the wall time, the ideal (N x 2 x L / C: every slot always waiting on the LLM), their
ratio, the peak number of PostgreSQL connections the worker held (sampled every 50 ms from
``pg_stat_activity``), how many plain connections a bystander opened during the run (one every
250 ms) and how many were refused, the worker process's peak RSS, and missions per second;
and the policy gate's figures: calls it could not decide (``policy_unavailable``), runs it
interrupted, the ledger's statements, and how long a call took from its checks to its result
(``tool_invocations.duration_ms`` of ``clock_now``, whose handler takes microseconds: the
gate's reservation is nearly all of it).

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a throw-away database in that server), else
an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from bench.tick_throughput import add_missions, run_all
from tests.fakes.async_llm_server import serve_in_process
from worker.daemon.app import application_name, open_app
from worker.settings import load_settings


class Watch:
    """Samples the worker's connections and probes that other clients can connect."""

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        self.database = parsed.database
        self.dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        self.peak_connections = 0
        self.probes = 0
        self.refused: list[str] = []

    async def run(self) -> None:
        monitor = await asyncpg.connect(self.dsn)
        try:
            probe_at = 0.0
            while True:
                held = await monitor.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = $1 AND application_name = $2",
                    self.database,
                    application_name("bench"),
                )
                self.peak_connections = max(self.peak_connections, held)
                if time.perf_counter() >= probe_at:
                    probe_at = time.perf_counter() + 0.25
                    self.probes += 1
                    try:
                        bystander = await asyncpg.connect(self.dsn, timeout=5)
                        await bystander.fetchval("SELECT 1")
                        await bystander.close()
                    except Exception as exc:
                        self.refused.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)
        finally:
            await monitor.close()


async def iteration_durations(url: str) -> list[float]:
    """Seconds from each iteration's start to its end."""
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        rows = await connection.fetch(
            "SELECT extract(epoch FROM finished_at - started_at) AS s FROM mission_iterations"
        )
    finally:
        await connection.close()
    return [float(r["s"]) for r in rows]


async def gate_figures(url: str) -> dict[str, Any]:
    """Iterations by status, policy_unavailable decisions, and call durations (ms)."""
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        statuses = await connection.fetch(
            "SELECT status || '/' || coalesce(stop_reason, '-') AS s, count(*) AS n "
            "FROM mission_iterations GROUP BY 1 ORDER BY 1"
        )
        unavailable = await connection.fetchval(
            "SELECT count(*) FROM tool_invocations "
            "WHERE policy_decision->>'reason' = 'policy_unavailable'"
        )
        durations = [
            float(r["duration_ms"])
            for r in await connection.fetch("SELECT duration_ms FROM tool_invocations")
        ]
    finally:
        await connection.close()
    return {
        "iterations": {r["s"]: r["n"] for r in statuses},
        "policy_unavailable": unavailable,
        "call_ms": durations,
    }


async def bench(server_url: str, args: argparse.Namespace, llm_url: str) -> None:
    async with throwaway_database(server_url) as url:
        await add_missions(url, args.missions, users=args.missions)
        settings = load_settings(
            database_url=url,
            llm_base_url=llm_url,
            max_concurrent_missions=args.concurrency,
            db_pool_size=args.pool,
            db_max_overflow=args.overflow,
            worker_id="bench",
            metrics_port=0,
            llm_timeout_s=max(30.0, 10 * args.latency),
            policy_mode=args.policy_mode,
        )
        watch = Watch(url)
        async with open_app(settings, migrate=True) as app:
            watcher = asyncio.create_task(watch.run())
            started = time.perf_counter()
            cpu_before = time.process_time()
            try:
                await run_all(app.worker, url, args.missions)
            finally:
                elapsed = time.perf_counter() - started
                cpu = time.process_time() - cpu_before
                watcher.cancel()
            durations = await iteration_durations(url)
            ledger = app.worker.runner.policy.ledger if app.worker.runner.policy else None
            gate = await gate_figures(url)
        ideal = args.missions * 2 * args.latency / args.concurrency
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"missions              {args.missions}")
        print(f"latency_s             {args.latency}")
        print(f"concurrency           {args.concurrency}")
        print(f"pool                  {args.pool} + overflow {args.overflow}")
        print(f"wall_s                {elapsed:.2f}")
        print(f"ideal_s               {ideal:.2f}  (missions x 2 x latency / concurrency)")
        print(f"wall/ideal            {elapsed / ideal if ideal else float('inf'):.2f}")
        print(
            f"iteration_s           median {statistics.median(durations):.2f}, "
            f"p95 {statistics.quantiles(durations, n=20)[-1]:.2f}, max {max(durations):.2f}  "
            f"(started to finished; {2 * args.latency:.2f} waiting on the LLM)"
        )
        print(f"peak_connections      {watch.peak_connections}  (the worker's, pg_stat_activity)")
        print(f"bystander_connects    {watch.probes - len(watch.refused)}/{watch.probes} ok")
        for reason in sorted(set(watch.refused))[:3]:
            print(f"  refused: {reason}")
        print(
            f"worker_cpu_s          {cpu:.2f}  ({1000 * cpu / args.missions:.2f} ms per mission, "
            "user + system, the worker's process only)"
        )
        print(f"peak_rss_mib          {rss_mib:.0f}  (the worker's process)")
        print(f"missions_per_s        {args.missions / elapsed:.1f}")
        print(f"policy_mode           {args.policy_mode}")
        print(f"iterations            {gate['iterations']}")
        print(
            f"policy_unavailable    {gate['policy_unavailable']}  (calls the gate could not decide)"
        )
        print(
            f"ledger_statements     {getattr(ledger, 'statements', '-')}  "
            f"(for {len(gate['call_ms'])} calls)"
        )
        calls = sorted(gate["call_ms"]) or [0.0]
        print(
            f"call_ms               median {statistics.median(calls):.1f}, "
            f"p99 {calls[int(0.99 * (len(calls) - 1))]:.1f}, max {calls[-1]:.1f}  "
            "(checks + gate + handler of clock_now)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--missions", type=at_least(1), default=1000, help="due missions")
    parser.add_argument(
        "--latency", type=at_least(0.001, float), default=1.0, help="seconds per LLM answer"
    )
    parser.add_argument(
        "--concurrency", type=at_least(1), default=500, help="MANA_AI_MAX_CONCURRENT_MISSIONS"
    )
    parser.add_argument("--pool", type=at_least(1), default=10, help="MANA_AI_DB_POOL_SIZE")
    parser.add_argument("--overflow", type=at_least(0), default=0, help="MANA_AI_DB_MAX_OVERFLOW")
    parser.add_argument(
        "--policy-mode",
        choices=("off", "log-only", "enforce"),
        default="log-only",
        help="MANA_AI_POLICY_MODE",
    )
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    server = context.Process(target=serve_in_process, args=(args.latency, send), daemon=True)
    server.start()
    try:
        port = receive.recv()
        with database_server() as (server_url, where):
            print(f"database              {where}")
            asyncio.run(bench(server_url, args, f"http://127.0.0.1:{port}/v1"))
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
