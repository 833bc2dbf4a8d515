"""Tracing overhead: microseconds per round of a mission's loop with tracing off and on.

Not a test: it prints figures. Usage::

    python bench/tracing_overhead.py [--rounds 5] [--tools 1] [--loops 1000] [--repeat 5]

Each loop is what ``MissionRunner`` runs for one mission, minus the database: the planner loop
(``bench/loop_overhead.py``'s scripted instant model and no-op ``read`` tools) inside
``worker.tracing.hooks.traced_run``, with a sink that does nothing (the journal's work is not
tracing's). Configurations, in the same sitting:

* ``off``: ``traced_run(None, ...)``, as the worker runs without ``MANA_AI_OTEL``;
* ``spans``: the worker's tracing with ``OTEL_METRICS_EXPORTER=none`` (``open_tracing``:
  the SDK's ``BatchSpanProcessor`` and ``OTLPSpanExporter``, ``TracedChatModel`` around the
  model, ``RunTracer``), exporting over OTLP/HTTP to an endpoint in another process that
  drops what it gets (``bench.common.otlp_sink``); the figure includes exporting every span
  (a ``force_flush`` ends each run);
* ``spans + metrics``: the same with the ``gen_ai.client.*`` metrics (the default when on);
* ``+ content``: and ``MANA_AI_OTEL_CAPTURE_CONTENT``.

The best of ``--repeat`` runs is reported, with each configuration's ratio to ``off`` and the
spans made per round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, otlp_sink
from bench.loop_overhead import ReplayModel, noop_tools, script
from planner import PlannerLoopInput, RunEvent, ToolContext, run_planner_loop
from worker.store.records import ClaimedMission, StartedIteration
from worker.tracing.hooks import RunTracing, traced_run


async def _sink(event: RunEvent) -> None:
    return None


MISSION = ClaimedMission(
    id=1,
    objective="Go.",
    cron=None,
    timezone="UTC",
    scheduled_for=datetime.now(UTC),
    deadline=None,
    agent_id=1,
    agent_name="bench",
    owner_user_id="u1",
    model="bench-model",
    system_prompt="You are a benchmark.",
    max_rounds=5,
    max_tokens_per_day=None,
    allowed_tools=None,
)
ITERATION = StartedIteration(id=1, attempt=1)


def tracing_on(capture_content: bool, metrics: bool) -> tuple[RunTracing, Any, Any]:
    """``(run tracer, model wrapper factory, Tracing)`` as ``worker.daemon.app`` wires them."""
    from worker.tracing.chat_spans import TracedChatModel
    from worker.tracing.run_spans import RunTracer
    from worker.tracing.setup import open_tracing

    tracing = open_tracing(
        worker_id="bench",
        capture_content=capture_content,
        environ={"OTEL_METRICS_EXPORTER": "otlp"},
    )

    def wrap(model: Any) -> Any:
        return TracedChatModel(
            model, tracing, provider="openai", endpoints={"primary": ("127.0.0.1", 4318)}
        )

    return RunTracer(tracing, provider="openai"), wrap, tracing


async def measure(rounds: int, k: int, loops: int, repeat: int) -> dict[str, float]:
    tools = noop_tools(k)
    offered = frozenset(t.name for t in tools)  # as the runner gives them: named on spans
    responses = script(rounds, k)
    results: dict[str, float] = {}
    for name in ("off", "spans", "spans + metrics", "+ content"):
        runs: RunTracing | None = None
        wrap: Any = None
        tracing: Any = None
        if name != "off":
            runs, wrap, tracing = tracing_on(
                capture_content=name == "+ content", metrics=name != "spans"
            )

        def inputs(n: int) -> list[PlannerLoopInput]:
            return [
                PlannerLoopInput(
                    system_prompt="You are a benchmark.",
                    user_prompt="Go.",
                    tools=tools,
                    max_rounds=rounds,
                    ctx=ToolContext(user_id="u1"),
                    model="bench-model",
                )
                for _ in range(n)
            ]

        async def one(inp: PlannerLoopInput, tracer: RunTracing | None, wrapper: Any) -> None:
            model = ReplayModel(responses)
            llm = wrapper(model) if wrapper is not None else model
            async with traced_run(
                tracer, MISSION, ITERATION, "bench-model", _sink, offered
            ) as sink:
                await run_planner_loop(inp, llm=llm, sink=sink)

        for inp in inputs(loops // 10):  # warm up
            await one(inp, runs, wrap)
        best = float("inf")
        for _ in range(repeat):
            batch = inputs(loops)
            gc.collect()
            gc.freeze()
            started = time.perf_counter()
            for inp in batch:
                await one(inp, runs, wrap)
            if tracing is not None:  # every span exported is part of the cost
                tracing._tracer_provider.force_flush()
            best = min(best, (time.perf_counter() - started) / (loops * rounds) * 1e6)
            gc.unfreeze()
        if tracing is not None:
            tracing.shutdown()
        results[name] = best
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=at_least(2), default=5, help="rounds per loop (5)")
    parser.add_argument("--tools", type=at_least(1), default=1, help="tool calls per round (1)")
    parser.add_argument("--loops", type=at_least(10), default=1000, help="loops per run (1000)")
    parser.add_argument("--repeat", type=at_least(1), default=5, help="runs; the best counts (5)")
    args = parser.parse_args()
    with otlp_sink() as endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        # no span dropped for a full queue: every one is made and exported
        os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(args.loops * args.rounds * 4))
        results = asyncio.run(measure(args.rounds, args.tools, args.loops, args.repeat))
    base = results["off"]
    # invoke_agent, a chat span per round, a tool span per call (every round but the last)
    spans = (1 + args.rounds + (args.rounds - 1) * args.tools) / args.rounds
    print(
        f"tracing overhead: {args.rounds} rounds x {args.tools} no-op tool call(s) per round, "
        f"{spans:.1f} spans per round when on"
    )
    for name, us in results.items():
        print(
            f"  {name:<16} {us:8.1f} us/round   ratio {us / base:5.2f}   +{us - base:6.1f} us/round"
        )


if __name__ == "__main__":
    main()
