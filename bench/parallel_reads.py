"""Parallel reads: one round of k read calls of latency L, run one by one and concurrently.

Not a test: it prints figures. Usage::

    python bench/parallel_reads.py [--rounds 3] [--cap 10]

For each case it runs the round through the real ``planner.execution.execute_calls`` (checks,
segmentation, sliding window, source-order results) with an in-process read tool that waits
L seconds (``asyncio.sleep``), first with ``max_parallel_reads=1`` (sequential), then with the
cap. It prints, per case, the median wall time of a round, the speed-up, and the *overhead*:
wall time above the physical limit, the slowest chain of reads the cap allows
(``ceil(k / cap) * L`` in parallel, ``k * L`` sequentially). The target is a parallel
overhead under 5 ms per round; the ratio printed last is the worst overhead / 5 ms (≤ 1 is on
target). No database, no sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import ToolCall, ToolContext, ToolRegistry, ToolSpec
from planner.execution import execute_calls

TARGET_OVERHEAD_MS = 5.0
CASES = [(5, 0.200), (11, 0.200), (50, 0.020), (50, 0.0)]
"""(k reads, latency L in seconds); the last one shows the shell's own cost."""


async def _sleep_read(args: dict[str, Any], ctx: ToolContext) -> dict[str, float]:
    await asyncio.sleep(float(args["latency_s"]))
    return {"slept_s": float(args["latency_s"])}


READ = ToolSpec(
    "sleep_read",
    "Waits, then answers.",
    {"type": "object", "properties": {"latency_s": {"type": "number"}}},
    "read",
    _sleep_read,
)


async def _round_s(k: int, latency_s: float, cap: int) -> float:
    calls = [
        ToolCall(id=f"c{i}", name="sleep_read", arguments={"latency_s": latency_s})
        for i in range(k)
    ]
    registry = ToolRegistry([READ])
    started = time.perf_counter()
    done = await execute_calls(
        calls, round=1, registry=registry, ctx=ToolContext(user_id="bench"), max_parallel_reads=cap
    )
    elapsed = time.perf_counter() - started
    if [e.call.id for e in done] != [c.id for c in calls] or not all(e.ok for e in done):
        raise RuntimeError("a round lost its order or a call failed")
    return elapsed


async def bench(rounds: int, cap: int) -> None:
    print(f"rounds per case     {rounds} (median shown)")
    print(f"cap                 {cap}")
    header = (
        f"{'case':<14}{'sequential_ms':>14}{'parallel_ms':>13}{'speed_up':>10}"
        f"{'limit_ms':>10}{'overhead_ms':>13}{'seq_overhead_ms':>17}"
    )
    print(header)
    worst_ms = 0.0
    for k, latency_s in CASES:
        sequential = statistics.median([await _round_s(k, latency_s, 1) for _ in range(rounds)])
        parallel = statistics.median([await _round_s(k, latency_s, cap) for _ in range(rounds)])
        limit = math.ceil(k / cap) * latency_s
        overhead_ms = (parallel - limit) * 1000
        seq_overhead_ms = (sequential - k * latency_s) * 1000
        worst_ms = max(worst_ms, overhead_ms)
        case = f"{k} x {latency_s * 1000:g} ms"
        speed_up = f"{sequential / parallel:.2f}x" if parallel > 0 else "-"
        print(
            f"{case:<14}{sequential * 1000:>14.1f}{parallel * 1000:>13.1f}{speed_up:>10}"
            f"{limit * 1000:>10.1f}{overhead_ms:>13.2f}{seq_overhead_ms:>17.2f}"
        )
    print(
        f"worst parallel overhead {worst_ms:.2f} ms per round; "
        f"ratio to the {TARGET_OVERHEAD_MS:g} ms target: {worst_ms / TARGET_OVERHEAD_MS:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cap", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(bench(args.rounds, args.cap))


if __name__ == "__main__":
    main()
