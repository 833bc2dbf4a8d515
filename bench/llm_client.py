"""The LLM HTTP client end to end: requests per second of ``OpenAICompatibleChatModel`` against
a fake endpoint over real HTTP that answers after ``--llm-latency-ms``, at several
concurrencies, this source tree beside others (``--compare DIR ...``: e.g. the same provider
posting through httpx's or httpx2's client instead of aiohttp's, a tree unpacked with
``git archive``).

Not a test: it prints figures. Usage::

    python bench/llm_client.py [--llm-latency-ms 1000] [--llm-latency-spread-ms 0]
                               [--concurrency 10 50 100] [--rounds 10] [--runs 2]
                               [--compare DIR ...]

The endpoint is this tree's ``tests.fakes.async_llm_server`` in a child process (its CPU is
not the client's), one per concurrency, the same for every tree; each answer takes
``--llm-latency-ms`` give or take a uniform ``--llm-latency-spread-ms`` (the issue's budget
has a model answering in 0.5-1.5 s: 1000 and 500). At each concurrency *c* the client keeps
*c* requests in flight (``max_connections`` = *c*, as the worker sizes it to
``MANA_AI_MAX_CONCURRENT_MISSIONS``) and sends ``c * rounds`` of them after a warm-up round
that opens the connections. Each measurement runs
in its own process; the trees alternate run by run. Figures: requests per second (end to end,
the wall of all requests) and the client's CPU per request, per run; then per concurrency the
median throughput of each tree and its ratio to this tree's (the other / this tree). The
issue's rule: the older client stays only if it gains >= 20 % of throughput at concurrency
<= 100 at a realistic latency (docs/performance.md, "LLM HTTP client").
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _model_class() -> Any:
    """``OpenAICompatibleChatModel`` of the tree first on the path (``worker.llm`` now,
    ``planner.providers`` before the move)."""
    for module in ("worker.llm", "planner.providers"):
        try:
            return importlib.import_module(module).OpenAICompatibleChatModel
        except (ImportError, AttributeError):
            continue
    raise SystemExit("no OpenAICompatibleChatModel in this tree")


async def measure(requests: int, in_flight: int, port: int) -> dict[str, float]:
    """Send ``requests`` requests ``in_flight`` at a time; throughput and CPU per request."""
    from planner import ChatMessage, CompletionRequest

    model = _model_class()(base_url=f"http://127.0.0.1:{port}/v1", max_connections=in_flight)
    request = CompletionRequest(
        messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Tell the time."),
        ],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "clock_now",
                    "description": "The current time.",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
    )
    slots = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with slots:
            await model.complete(request)

    try:
        await asyncio.gather(*(one() for _ in range(in_flight)))  # connections opened
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await model.aclose()
    return {"requests_per_s": requests / wall, "cpu_us_per_request": cpu / requests * 1e6}


def side(tree: str, requests: int, in_flight: int, port: int) -> None:
    """In the child: ``tree`` first on the path, one measurement against ``port``."""
    sys.path.insert(0, tree)
    print(json.dumps(asyncio.run(measure(requests, in_flight, port))))


def one_process(tree: Path, requests: int, in_flight: int, port: int) -> dict[str, float]:
    """One measurement of the source tree ``tree``, in a fresh process."""
    argv = [sys.executable, __file__, "--side", str(tree), "--port", str(port)]
    argv += ["--requests", str(requests), "--concurrency", str(in_flight)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def endpoint(latency_s: float, spread_s: float) -> tuple[Any, int]:
    """The fake endpoint in a child process, and its port."""
    from tests.fakes.async_llm_server import serve_in_process

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    server = context.Process(target=serve_in_process, args=(latency_s, send, spread_s), daemon=True)
    server.start()
    return server, receive.recv()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--llm-latency-ms", type=float, default=1000.0)
    parser.add_argument("--llm-latency-spread-ms", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--rounds", type=int, default=10, help="requests = concurrency * rounds")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--compare", metavar="DIR", nargs="+", default=[], help="other trees")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(args.side, args.requests, args.concurrency[0], args.port)
        return
    trees = [ROOT, *(Path(tree).resolve() for tree in args.compare)]
    latency_s, spread_s = args.llm_latency_ms / 1000, args.llm_latency_spread_ms / 1000
    print(
        f"latency {args.llm_latency_ms:g} ms +- {args.llm_latency_spread_ms:g} ms, "
        f"{args.rounds} rounds per run",
        flush=True,
    )
    for in_flight in args.concurrency:
        figures: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
        server, port = endpoint(latency_s, spread_s)
        try:
            for run in range(args.runs):
                for tree in trees if run % 2 == 0 else trees[::-1]:
                    got = one_process(tree, in_flight * args.rounds, in_flight, port)
                    figures[tree].append(got)
                    print(
                        f"  c={in_flight} run {run + 1} {tree}: {got['requests_per_s']:.1f} "
                        f"requests/s, {got['cpu_us_per_request']:.0f} us CPU per request",
                        flush=True,
                    )
        finally:
            server.kill()
        medians = [statistics.median(r["requests_per_s"] for r in figures[t]) for t in trees]
        cpus = [statistics.median(r["cpu_us_per_request"] for r in figures[t]) for t in trees]
        line = f"c={in_flight}: " + ", ".join(
            f"{tree.name}: {rps:.1f} requests/s, {cpu:.0f} us CPU/request"
            for tree, rps, cpu in zip(trees, medians, cpus, strict=True)
        )
        for tree, rps in zip(trees[1:], medians[1:], strict=True):
            line += f"; {tree.name} / this tree {rps / medians[0]:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
