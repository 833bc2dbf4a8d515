"""The LLM request path alone: CPU microseconds per request of ``OpenAICompatibleChatModel``
against an instant fake endpoint in another process, optionally beside an older source tree.

Not a test: it prints figures. Usage::

    python bench/llm_requests.py [--requests 2000] [--in-flight 50] [--runs 3] [--compare DIR]

The endpoint is ``tests.fakes.async_llm_server`` in a child process (its CPU is not the
client's), answering at once. The client sends a two-message request with one tool
definition, ``--in-flight`` at a time, after a warm-up round that opens the connections.
Each measurement runs in its own process; with ``--compare DIR`` the same measurement of the
source tree in DIR (an older commit unpacked with ``git archive``) alternates with this one.
Figures: the client process's CPU time per request (``time.process_time``) and requests per
second, per run, then the ranges and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def measure(requests: int, in_flight: int, port: int) -> dict[str, float]:
    from planner import ChatMessage, CompletionRequest
    from worker.llm import OpenAICompatibleChatModel

    model = OpenAICompatibleChatModel(
        base_url=f"http://127.0.0.1:{port}/v1", max_connections=in_flight
    )
    tool = {
        "type": "function",
        "function": {
            "name": "clock_now",
            "description": "The current time.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    request = CompletionRequest(
        messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Tell the time."),
        ],
        tools=[tool],
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
    return {"cpu_us_per_request": cpu / requests * 1e6, "requests_per_s": requests / wall}


def one_process(tree: Path, requests: int, in_flight: int) -> dict[str, float]:
    """One measurement of the source tree ``tree``, in a fresh process."""
    argv = [sys.executable, __file__, "--side", str(tree)]
    argv += ["--requests", str(requests), "--in-flight", str(in_flight)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def side(tree: str, requests: int, in_flight: int) -> None:
    """In the child: ``tree`` first on the path, the fake endpoint started, one measurement."""
    sys.path.insert(0, tree)
    from tests.fakes.async_llm_server import serve_in_process

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    server = context.Process(target=serve_in_process, args=(0.0, send), daemon=True)
    server.start()
    try:
        port = receive.recv()
        print(json.dumps(asyncio.run(measure(requests, in_flight, port))))
    finally:
        server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--compare", metavar="DIR", help="an older source tree, alternating")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        side(args.side, args.requests, args.in_flight)
        return
    trees = [ROOT, *([Path(args.compare)] if args.compare else [])]
    figures: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for run in range(args.runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:
            got = one_process(tree, args.requests, args.in_flight)
            figures[tree].append(got)
            print(
                f"run {run + 1} {tree}: {got['cpu_us_per_request']:.0f} us CPU per request, "
                f"{got['requests_per_s']:.0f} requests/s",
                flush=True,
            )
    for tree, runs in figures.items():
        cpu = [r["cpu_us_per_request"] for r in runs]
        print(f"{tree}: {min(cpu):.0f}-{max(cpu):.0f} us CPU per request")
    if args.compare:
        ours, theirs = (
            statistics.median(r["cpu_us_per_request"] for r in figures[t]) for t in trees
        )
        print(f"ratio of the medians (this tree / {args.compare}): {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
