"""Loop overhead: microseconds per round of ``run_planner_loop`` with a scripted model and no-op
tools, with the policy gate and the reminder channel off and on.

Not a test: it prints figures. Usage::

    python bench/loop_overhead.py [--rounds 5] [--tools 1] [--loops 2000] [--repeat 7]
                                  [--max-parallel-reads 10]

Each loop runs ``--rounds`` rounds; every round but the last asks for ``--tools`` calls of
no-op ``read`` tools (arguments ``{"text": "step N"}``), the last answers. The model is
in-process and instant, so the figure is the loop's own cost: building requests, running
calls, logging messages — plus, when on, the gate (``RulePolicyGate`` in ``enforce`` over the
in-memory ledger, with a limit high enough never to refuse), the reminder channel (the
runner's, every producer on: ``worker.run.reminder_channel.mission_reminder_channel``) and,
in "everything on", also the compaction check (a ``Compactor`` whose threshold is never
reached). Times are the process's CPU time (``time.process_time``: on a machine shared with
other work, wall time also counts the time others had the core). The best of ``--repeat``
runs is reported, with each configuration's ratio to the bare loop. ``--max-parallel-reads 1``
runs a round's calls one after the other in the round's own task, none in a task of its own
(what the loop costs without the parallel reads' tasks).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import (
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    PlannerLoopInput,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.compaction import Compactor
from planner.execution import DEFAULT_MAX_PARALLEL_READS
from planner.gate import RulePolicyGate
from planner.policy import PolicyConfig, RateLimit, UserPolicySettings
from planner.testing import InMemoryCallLedger
from reminders import ReminderComposer
from worker.run.reminder_channel import mission_reminder_channel


async def _noop(args: dict[str, Any], ctx: ToolContext) -> dict[str, bool]:
    return {"ok": True}


def noop_tools(k: int) -> list[ToolSpec]:
    """``k`` read tools ``noop_0`` … that do nothing (what the loop costs without the tools)."""
    return [
        ToolSpec(
            name=f"noop_{i}",
            description="Does nothing.",
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            policy_hint="read",
            handler=_noop,
        )
        for i in range(k)
    ]


class ReplayModel:
    """Replays ``responses`` (built once, before the clock starts), one per request."""

    def __init__(self, responses: list[CompletionResponse]) -> None:
        self.responses = responses
        self.count = 0

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        self.count += 1
        return self.responses[self.count - 1]


def script(rounds: int, k: int) -> list[CompletionResponse]:
    """``rounds - 1`` responses that call ``k`` no-op tools (other arguments every round, as a
    mission that makes progress would), then a final answer."""
    usage = TokenUsage(prompt_tokens=1, completion_tokens=1)
    calling = [
        CompletionResponse(
            message=ChatMessage(
                role="assistant",
                tool_calls=tuple(
                    ToolCall(id=f"call_{r}_{i}", name=f"noop_{i}", arguments={"text": f"step {r}"})
                    for i in range(k)
                ),
            ),
            usage=usage,
        )
        for r in range(1, rounds)
    ]
    answer = CompletionResponse(message=ChatMessage(role="assistant", content="done"), usage=usage)
    return [*calling, answer]


def reminder_channel() -> ReminderComposer:
    """The runner's channel, every producer on (a budget and a deadline far from reached)."""
    return mission_reminder_channel(
        max_tokens_per_day=10**9,
        tokens_used_24h=0,
        deadline=datetime.now(UTC) + timedelta(days=365),
        clock=lambda: datetime.now(UTC),
    )


def configurations() -> dict[str, Callable[[], dict[str, Any]]]:
    """Name -> a function giving the extra ``PlannerLoopInput`` fields of one loop."""

    def gate() -> RulePolicyGate:
        return RulePolicyGate(
            mode="enforce",
            config=PolicyConfig(rate_limit=RateLimit(100_000, timedelta(milliseconds=100))),
            user_settings=UserPolicySettings(),
            ledger=InMemoryCallLedger(),
        )

    def everything() -> dict[str, Any]:
        return {"policy": gate(), "reminder_channel": reminder_channel(), "compactor": compactor()}

    return {
        "bare loop": lambda: {},
        "gate": lambda: {"policy": gate()},
        "reminders": lambda: {"reminder_channel": reminder_channel()},
        "gate + reminders": lambda: {"policy": gate(), "reminder_channel": reminder_channel()},
        EVERYTHING: everything,
    }


EVERYTHING = "everything on"
"""The gate, the reminder channel and the compaction check (a context never near its limit),
as a mission runs by default."""


def compactor() -> Compactor:
    """A compactor whose threshold the benchmark never reaches: the check runs every round."""
    return Compactor(llm=ReplayModel([]), max_ctx=1_000_000)


async def measure(
    rounds: int,
    k: int,
    loops: int,
    repeat: int,
    only: str | None = None,
    max_parallel_reads: int = DEFAULT_MAX_PARALLEL_READS,
) -> dict[str, float]:
    """Microseconds per round of each configuration (the best of ``repeat`` runs of ``loops``
    loops); ``only``: that configuration alone; ``max_parallel_reads``: the loop's."""
    tools = noop_tools(k)
    responses = script(rounds, k)
    results: dict[str, float] = {}
    for name, extra in configurations().items():
        if only is not None and name != only:
            continue

        def inputs(n: int, extra: Callable[[], dict[str, Any]] = extra) -> list[PlannerLoopInput]:
            # one input per loop (the gate and the channel keep per-loop state), built
            # before the clock starts
            return [
                PlannerLoopInput(
                    system_prompt="You are a benchmark.",
                    user_prompt="Go.",
                    tools=tools,
                    max_rounds=rounds,
                    ctx=ToolContext(user_id="u1"),
                    max_parallel_reads=max_parallel_reads,
                    **extra(),
                )
                for _ in range(n)
            ]

        for inp in inputs(loops // 10):  # warm up
            await run_planner_loop(inp, llm=ReplayModel(responses))
        best = float("inf")
        for _ in range(repeat):
            batch = inputs(loops)
            models = [ReplayModel(responses) for _ in range(loops)]
            gc.collect()
            gc.freeze()  # the prebuilt inputs are not the loop's garbage to collect
            started = time.process_time()
            for inp, model in zip(batch, models, strict=True):
                await run_planner_loop(inp, llm=model)
            best = min(best, (time.process_time() - started) / (loops * rounds) * 1e6)
            gc.unfreeze()
        results[name] = best
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per loop (5)")
    parser.add_argument("--tools", type=int, default=1, help="tool calls per round (1)")
    parser.add_argument("--loops", type=int, default=2000, help="loops per run (2000)")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the best counts (7)")
    parser.add_argument(
        "--max-parallel-reads",
        type=int,
        default=DEFAULT_MAX_PARALLEL_READS,
        help=f"read calls of a round at once ({DEFAULT_MAX_PARALLEL_READS}; 1: no task per call)",
    )
    args = parser.parse_args()
    results = asyncio.run(
        measure(
            args.rounds,
            args.tools,
            args.loops,
            args.repeat,
            max_parallel_reads=args.max_parallel_reads,
        )
    )
    base = results["bare loop"]
    print(
        f"loop overhead: {args.rounds} rounds x {args.tools} no-op tool call(s) per round, "
        f"at most {args.max_parallel_reads} at once"
    )
    for name, us in results.items():
        print(f"  {name:<18} {us:8.1f} us/round   ratio {us / base:5.2f}")


if __name__ == "__main__":
    main()
