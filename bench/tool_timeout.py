"""Tool-call timeout: ``planner.deadline``'s hand-written ``Deadline`` against the standard
library's ``asyncio.timeout``, per call and end to end.

Not a test: it prints figures. Usage::

    python bench/tool_timeout.py [--calls 50000] [--rounds 5] [--loops 400] [--repeat 25]

``Deadline`` says it does "what asyncio.timeout does, at a fifth of its cost per call" (it runs
once for every tool call). Three levels, each with ``Deadline`` (the code as it is) and with
``asyncio.timeout`` (``_run_handler`` as it would be written with it: ``async with
asyncio.timeout(timeout_s)`` around the handler, ``TimeoutError`` with ``expired()`` for "this
deadline fired", patched into ``planner.execution`` for the run):

1. **the deadline alone**: µs per ``await`` of a no-op coroutine under each deadline;
2. **execute_calls**: µs per tool call of ``execute_calls`` on rounds of 1 and of 10 no-op
   ``read`` calls (checks, schema validation, result records: what one tool call costs the
   loop);
3. **a whole round**: µs per round of ``run_planner_loop`` with a scripted instant model and
   one no-op call per round (``bench/loop_overhead.py``'s bare loop, ``--rounds`` rounds).

Before measuring, both variants are checked to behave alike: a result in time, the timeout
error when the deadline fires, and a cancellation of the run passed on. The best of
``--repeat`` short runs counts, the variants alternating, so that a busy machine hurts both
alike (many short runs find the quiet moments; on 2 shared cores fewer, longer runs scattered
the round's difference between -0.5 and +5.6 µs). The verdict is the difference per round as
a share of the round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loop_overhead import ReplayModel, script
from planner import PlannerLoopInput, ToolCall, ToolContext, ToolSpec, execution, run_planner_loop
from planner.deadline import Deadline
from planner.errors import RunInterrupted, ToolError
from planner.tools import ToolRegistry

VARIANTS = ("Deadline", "asyncio.timeout")


async def _run_handler_asyncio_timeout(
    ready: Any,
    ctx: ToolContext,
    executor: Any,
    timeout_s: float | None,
    done: Callable[[Any, str | None], Any],
) -> Any:
    """``planner.execution._run_handler`` written with ``asyncio.timeout``: the same results
    and errors for every way a call ends."""
    call, spec = ready.call, ready.spec
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            if executor is not None:
                result = await executor(call)
            else:
                result = await spec.handler(dict(call.arguments), ctx)
    except TimeoutError as exc:
        if deadline.expired():
            return done(None, execution._timeout_error(spec, timeout_s))
        return done(None, f"{call.name} failed: {type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        this_task = asyncio.current_task()
        if this_task is not None and this_task.cancelling():
            raise  # the run (or this round) is being cancelled: not the tool's failure
        return done(None, f"{call.name} failed: it was cancelled from inside the tool")
    except RunInterrupted:
        raise
    except ToolError as exc:
        return done(None, str(exc))
    except Exception as exc:
        return done(None, f"{call.name} failed: {type(exc).__name__}: {exc}")
    return done(result, None)


@contextmanager
def variant(name: str) -> Iterator[None]:
    """``planner.execution`` as it is (``Deadline``), or with ``asyncio.timeout``."""
    original = execution._run_handler
    if name == "asyncio.timeout":
        execution._run_handler = _run_handler_asyncio_timeout  # type: ignore[assignment]
    try:
        yield
    finally:
        execution._run_handler = original  # type: ignore[assignment]


async def _noop(args: dict[str, Any], ctx: ToolContext) -> dict[str, bool]:
    return {"ok": True}


HANGING = asyncio.Event()


async def _hang(args: dict[str, Any], ctx: ToolContext) -> None:
    HANGING.set()
    await asyncio.Event().wait()


def _spec(name: str, handler: Callable[..., Awaitable[Any]]) -> ToolSpec:
    return ToolSpec(
        name=name,
        description="Benchmark tool.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        policy_hint="read",
        handler=handler,
    )


NOOPS = [_spec(f"noop_{i}", _noop) for i in range(10)]


async def check_alike() -> None:
    """Both variants: a result in time, the timeout error, a run's cancellation passed on."""
    registry = ToolRegistry([*NOOPS, _spec("hang", _hang)])
    ctx = ToolContext(user_id="u1")
    seen: dict[str, tuple[Any, ...]] = {}
    for name in VARIANTS:
        with variant(name):
            [ok, late] = await execute(
                registry,
                ctx,
                [
                    ToolCall(id="c1", name="noop_0", arguments={}),
                    ToolCall(id="c2", name="hang", arguments={}),
                ],
                0.05,
            )
            HANGING.clear()
            calls = [ToolCall(id="c3", name="hang", arguments={})]
            task = asyncio.create_task(execute(registry, ctx, calls, 60))
            await HANGING.wait()  # the call is running
            task.cancel()
            try:
                await task
                cancelled = False
            except asyncio.CancelledError:
                cancelled = True
        seen[name] = (ok.result, ok.error, late.result, late.error, cancelled)
    first, second = seen.values()
    if first != second or first[3] is None or "timed out" not in first[3] or not first[4]:
        raise SystemExit(f"the variants differ: {seen}")


async def execute(
    registry: ToolRegistry, ctx: ToolContext, calls: list[ToolCall], timeout_s: float
) -> list[Any]:
    return await execution.execute_calls(
        calls, round=1, registry=registry, ctx=ctx, tool_timeout_s=timeout_s
    )


def best_of(
    repeat: int, run: Callable[[str], Awaitable[float]]
) -> Callable[[], Awaitable[dict[str, float]]]:
    async def measure() -> dict[str, float]:
        best = dict.fromkeys(VARIANTS, float("inf"))
        for _ in range(repeat):
            for name in VARIANTS:  # alternating: a busy spell hurts both
                gc.collect()
                with variant(name):
                    best[name] = min(best[name], await run(name))
        return best

    return measure


async def deadline_alone(n: int, repeat: int) -> dict[str, float]:
    """µs per awaited no-op under each deadline (60 s, never reached)."""

    async def nothing() -> None:
        return None

    async def run(name: str) -> float:
        started = time.perf_counter()
        if name == "Deadline":
            for _ in range(n):
                deadline = Deadline(60.0)
                try:
                    await nothing()
                finally:
                    deadline.cancel()
        else:
            for _ in range(n):
                async with asyncio.timeout(60.0):
                    await nothing()
        return (time.perf_counter() - started) / n * 1e6

    return await best_of(repeat, run)()


async def per_call(k: int, n: int, repeat: int) -> dict[str, float]:
    """µs per tool call of ``execute_calls`` on rounds of ``k`` no-op read calls."""
    registry = ToolRegistry(NOOPS[:k])
    ctx = ToolContext(user_id="u1")
    rounds = max(1, n // k)
    batches = [
        [
            ToolCall(id=f"c{r}_{i}", name=f"noop_{i}", arguments={"text": f"step {r}"})
            for i in range(k)
        ]
        for r in range(rounds)
    ]

    async def run(name: str) -> float:
        started = time.perf_counter()
        for calls in batches:
            await execution.execute_calls(calls, round=1, registry=registry, ctx=ctx)
        return (time.perf_counter() - started) / (rounds * k) * 1e6

    return await best_of(repeat, run)()


async def per_round(rounds: int, loops: int, repeat: int) -> dict[str, float]:
    """µs per round of ``run_planner_loop``: one no-op call per round, instant model."""
    responses = script(rounds, 1)

    async def run(name: str) -> float:
        batch = [
            PlannerLoopInput(
                system_prompt="You are a benchmark.",
                user_prompt="Go.",
                tools=NOOPS[:1],
                max_rounds=rounds,
                ctx=ToolContext(user_id="u1"),
            )
            for _ in range(loops)
        ]
        models = [ReplayModel(responses) for _ in range(loops)]
        gc.collect()
        gc.freeze()  # the prebuilt inputs are not the loop's garbage to collect
        try:
            started = time.perf_counter()
            for inp, model in zip(batch, models, strict=True):
                await run_planner_loop(inp, llm=model)
            return (time.perf_counter() - started) / (loops * rounds) * 1e6
        finally:
            gc.unfreeze()

    return await best_of(repeat, run)()


def line(label: str, figures: dict[str, float], unit: str) -> str:
    ours, std = (figures[v] for v in VARIANTS)
    return (
        f"  {label:<30} Deadline {ours:7.2f}  asyncio.timeout {std:7.2f} {unit}   "
        f"ratio {std / ours:4.2f}   difference {std - ours:+6.2f} {unit}"
    )


async def main_async(args: argparse.Namespace) -> None:
    await check_alike()
    for warm in (per_call(1, 2000, 1), per_round(args.rounds, 100, 1)):  # warm up
        await warm
    alone = await deadline_alone(args.calls, args.repeat)
    one = await per_call(1, args.calls // 10, args.repeat)
    ten = await per_call(10, args.calls // 10, args.repeat)
    round_ = await per_round(args.rounds, args.loops, args.repeat)
    print(f"tool-call timeout: Deadline vs asyncio.timeout (best of {args.repeat})")
    print(line("deadline alone", alone, "us/call"))
    print(line("execute_calls, 1 call/round", one, "us/call"))
    print(line("execute_calls, 10 calls/round", ten, "us/call"))
    print(line(f"run_planner_loop ({args.rounds} rounds)", round_, "us/round"))
    ours, std = (round_[v] for v in VARIANTS)
    print(
        f"  verdict: asyncio.timeout costs {std - ours:+.2f} us per round of one call, "
        f"{(std - ours) / ours * 100:+.1f} % of the round's {ours:.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50_000, help="deadlines per run (50000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per loop (5)")
    parser.add_argument("--loops", type=int, default=400, help="loops per run (400)")
    parser.add_argument("--repeat", type=int, default=25, help="runs; the best counts (25)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
