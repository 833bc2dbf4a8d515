"""One round's tool calls: the plan (table-driven), then the concurrent shell, shown by the
order of start / end events that the tools record (never by timing)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from planner import (
    CallFinished,
    LoopState,
    PlannerLoopInput,
    PolicyDecision,
    ReadsOverlapped,
    RunEvent,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolRegistryError,
    ToolSpec,
    run_planner_loop,
)
from planner.calls import ExecutedCall
from planner.execution import Segment, execute_calls, plan_segments
from planner.testing import RecordingSink, ScriptedChatModel, final_answer, tool_calls
from planner.tools import PolicyHint

# A test that would hang if calls ran one by one fails after this long instead.
HANG_GUARD_S = 10.0

# --- the plan -------------------------------------------------------------------------------

R, W, D = "read", "write", "destructive"


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        ([], []),
        ([R], [(True, (0,))]),
        ([R, R, R], [(True, (0, 1, 2))]),
        ([W], [(False, (0,))]),
        ([R, R, W, R, R], [(True, (0, 1)), (False, (2,)), (True, (3, 4))]),
        ([W, W], [(False, (0,)), (False, (1,))]),
        ([D, R, None, W], [(False, (0,)), (True, (1, 2)), (False, (3,))]),
        ([None], [(True, (0,))]),
        ([R, D], [(True, (0,)), (False, (1,))]),
        (
            [W, R, R, R, W, D, R],
            [(False, (0,)), (True, (1, 2, 3)), (False, (4,)), (False, (5,)), (True, (6,))],
        ),
    ],
)
def test_plan_segments(
    hints: list[PolicyHint | None], expected: list[tuple[bool, tuple[int, ...]]]
) -> None:
    assert plan_segments(hints) == [Segment(p, i) for p, i in expected]


# --- a probe: tools that record what happened -------------------------------------------------


class Probe:
    """Tools ``r`` (read), ``w`` (write) and ``d`` (destructive) taking ``{"i": int}``.

    Each call appends ``("start", i)`` and ``("end", i)`` to ``events`` (``("cancelled", i)``
    when it was cancelled). A call waits for ``hold(i)`` first when ``hold`` is set, so tests
    decide when calls finish; ``when(predicate)`` waits until the events satisfy it.
    """

    def __init__(self, hold: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.hold = hold
        self.released: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self._changed = asyncio.Condition()

    async def handler(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, int]:
        i = int(args["i"])
        await self.record("start", i)
        try:
            if self.hold is not None:
                await self.hold(i)
        except asyncio.CancelledError:
            await self.record("cancelled", i)
            raise
        await self.record("end", i)
        return {"i": i}

    async def record(self, kind: str, i: int) -> None:
        async with self._changed:
            self.events.append((kind, i))
            self._changed.notify_all()

    async def when(self, predicate: Callable[[list[tuple[str, int]]], bool]) -> None:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: predicate(self.events)), HANG_GUARD_S
            )

    def started(self) -> set[int]:
        return {i for kind, i in self.events if kind == "start"}

    def ended(self) -> set[int]:
        return {i for kind, i in self.events if kind == "end"}

    def at(self, kind: str, i: int) -> int:
        return self.events.index((kind, i))

    def max_in_flight(self) -> int:
        running = peak = 0
        for kind, _ in self.events:
            running += {"start": 1, "end": -1, "cancelled": -1}.get(kind, 0)
            peak = max(peak, running)
        return peak

    def specs(self, timeout_s: float | None = None) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
        return [
            ToolSpec(name, f"{hint} probe", schema, hint, self.handler, timeout_s=timeout_s)
            for name, hint in (("r", "read"), ("w", "write"), ("d", "destructive"))
        ]


def on_finished(into: list[int]) -> Callable[[RunEvent], Awaitable[None]]:
    """A sink that keeps the position of each call as it finishes (completion order)."""

    async def sink(event: RunEvent) -> None:
        if isinstance(event, CallFinished):
            into.append(event.executed.index)

    return sink


def calls(*names: str) -> list[ToolCall]:
    """``calls("r", "r", "w")``: one call per name, argument ``i`` = its position."""
    return [ToolCall(id=f"c{i}", name=name, arguments={"i": i}) for i, name in enumerate(names)]


async def run(probe: Probe, batch: list[ToolCall], **kw: Any) -> list[ExecutedCall]:
    registry = kw.pop("registry", None) or ToolRegistry(probe.specs())
    return await asyncio.wait_for(
        execute_calls(batch, round=1, registry=registry, ctx=ToolContext(user_id="u"), **kw),
        HANG_GUARD_S,
    )


def wait_for_starts(probe: Probe, count: int) -> Callable[[int], Awaitable[None]]:
    """A hold: each call waits until ``count`` calls have started."""

    async def hold(i: int) -> None:
        await probe.when(lambda events: sum(k == "start" for k, _ in events) >= count)

    return hold


# --- concurrency ------------------------------------------------------------------------------


async def test_three_reads_run_concurrently() -> None:
    probe = Probe()
    probe.hold = wait_for_starts(probe, 3)  # sequential calls would wait forever
    done = await run(probe, calls("r", "r", "r"))
    starts = [probe.at("start", i) for i in range(3)]
    ends = [probe.at("end", i) for i in range(3)]
    assert max(starts) < min(ends), probe.events
    assert [e.result for e in done] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert all(e.ran and e.ok for e in done)


async def test_a_write_is_a_barrier_between_reads_and_the_gate_decides_in_source_order() -> None:
    probe = Probe()
    gated: list[int] = []

    async def hold(i: int) -> None:
        if i in (0, 1):  # the first two reads overlap
            await probe.when(lambda ev: {0, 1} <= {j for k, j in ev if k == "start"})
        if i in (3, 4):
            await probe.when(lambda ev: {3, 4} <= {j for k, j in ev if k == "start"})

    async def gate(spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        i = int(call.arguments["i"])
        gated.append(i)
        probe.events.append(("gate", i))
        return PolicyDecision(allow=True)

    probe.hold = hold
    done = await run(probe, calls("r", "r", "w", "r", "r"), policy=gate)

    write_start, write_end = probe.at("start", 2), probe.at("end", 2)
    assert probe.at("end", 0) < write_start and probe.at("end", 1) < write_start
    assert write_end < probe.at("start", 3) and write_end < probe.at("start", 4)
    assert gated == [0, 1, 2, 3, 4]
    for i in range(5):
        assert probe.at("gate", i) < probe.at("start", i)
    assert probe.at("end", 1) < probe.at("gate", 2)  # the write is decided once it may run
    assert [e.call.id for e in done] == ["c0", "c1", "c2", "c3", "c4"]


async def test_eleven_reads_with_cap_ten_use_a_sliding_window_and_keep_source_order() -> None:
    probe = Probe()

    async def hold(i: int) -> None:
        await probe.released[i].wait()

    probe.hold = hold
    finished: list[int] = []
    task = asyncio.create_task(
        run(
            probe,
            calls(*["r"] * 11),
            max_parallel_reads=10,
            sink=on_finished(finished),
        )
    )
    await probe.when(lambda ev: len(ev) == 10)
    assert probe.started() == set(range(10)), "the 11th waits for a free slot"

    probe.released[7].set()  # one slot frees: the 11th starts while the other nine still run
    await probe.when(lambda ev: ("start", 10) in ev)
    assert probe.ended() == {7}

    for i in (10, 3, 0, 9, 1, 2, 4, 5, 6, 8):
        probe.released[i].set()
    done = await task
    assert probe.max_in_flight() == 10
    assert [e.index for e in done] == list(range(11))
    assert [e.result for e in done] == [{"i": i} for i in range(11)]
    assert finished[0] == 7 and sorted(finished) == list(range(11))


async def test_results_are_in_source_order_and_callbacks_in_completion_order() -> None:
    probe = Probe()

    async def hold(i: int) -> None:  # finish in reverse order: 3, 2, 1, 0
        await probe.when(lambda ev: len(probe.started()) == 4)
        if i < 3:
            await probe.when(lambda ev: ("end", i + 1) in ev)

    probe.hold = hold
    seen: list[int] = []
    done = await run(probe, calls("r", "r", "r", "r"), sink=on_finished(seen))
    assert seen == [3, 2, 1, 0]
    assert [e.index for e in done] == [0, 1, 2, 3]
    assert [e.call.id for e in done] == ["c0", "c1", "c2", "c3"]


async def test_a_denied_read_takes_no_slot() -> None:
    probe = Probe()
    probe.hold = wait_for_starts(probe, 2)  # reads 0 and 2 must overlap under a cap of 2

    async def gate(spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        return PolicyDecision(allow=call.arguments["i"] != 1, reason="rate limited")

    done = await run(probe, calls("r", "r", "r"), policy=gate, max_parallel_reads=2)
    assert probe.started() == {0, 2}
    assert [e.ok for e in done] == [True, False, True]
    assert done[1].error == "denied by policy: rate limited" and not done[1].ran


async def test_reads_that_cannot_run_get_their_errors_in_place() -> None:
    probe = Probe()
    batch = [
        ToolCall(id="a", name="r", arguments={"i": 0}),
        ToolCall(id="b", name="nope", arguments={}),
        ToolCall(id="c", name="r", arguments={"i": "x"}),
        ToolCall(id="d", name="r", arguments={}, parse_error="Expecting value"),
        ToolCall(id="e", name="r", arguments={"i": 4}),
    ]
    done = await run(probe, batch)
    assert [e.call.id for e in done] == ["a", "b", "c", "d", "e"]
    assert [e.ok for e in done] == [True, False, False, False, True]
    assert [e.ran for e in done] == [True, False, False, False, True]
    assert "unknown tool 'nope'" in (done[1].error or "")


# --- failure isolation and cancellation -------------------------------------------------------


@pytest.mark.parametrize("failure", ["raises", "times out"])
async def test_one_failing_read_among_five_leaves_four_good_results(failure: str) -> None:
    probe = Probe()

    async def slow_or_broken(args: dict[str, Any], ctx: ToolContext) -> None:
        if failure == "raises":
            await probe.record("failed", 2)
            raise ConnectionError("host unreachable")
        try:
            await asyncio.Event().wait()
        finally:
            await probe.record("failed", 2)

    async def hold(i: int) -> None:  # siblings are still running when the failure happens
        await probe.when(lambda ev: ("failed", 2) in ev)

    probe.hold = hold
    # the 10 ms deadline only where it is the failure: a tool that raises could otherwise be
    # stopped on a loaded machine before it records its failure, and its siblings wait forever
    timeout_s = 0.01 if failure == "times out" else None
    flaky = ToolSpec(
        "flaky", "fails", {"type": "object"}, "read", slow_or_broken, timeout_s=timeout_s
    )
    registry = ToolRegistry([*probe.specs(), flaky])
    batch = calls("r", "r", "flaky", "r", "r")
    done = await run(probe, batch, registry=registry)

    assert [e.ok for e in done] == [True, True, False, True, True]
    assert [e.result for e in done if e.ok] == [{"i": 0}, {"i": 1}, {"i": 3}, {"i": 4}]
    assert probe.ended() == {0, 1, 3, 4}
    expected = (
        "flaky failed: host unreachable"
        if failure == "raises"
        else "flaky timed out after 0.01 s and was stopped; it returned nothing"
    )
    assert done[2].error == expected


async def test_a_timed_out_write_says_its_outcome_is_unknown() -> None:
    async def stuck(args: dict[str, Any], ctx: ToolContext) -> None:
        await asyncio.Event().wait()

    save = ToolSpec("save", "saves", {"type": "object"}, "write", stuck)
    done = await execute_calls(
        [ToolCall(id="s", name="save", arguments={})],
        round=1,
        registry=ToolRegistry([save]),
        ctx=ToolContext(user_id="u"),
        tool_timeout_s=0.01,  # the loop's default applies: the spec sets none
    )
    assert done[0].error == (
        "save timed out after 0.01 s and was stopped; its outcome is unknown: the write may "
        "or may not have taken effect, check before retrying it"
    )


async def test_a_tool_raising_its_own_timeout_error_is_not_reported_as_a_timeout() -> None:
    async def raises(args: dict[str, Any], ctx: ToolContext) -> None:
        raise TimeoutError("upstream said 504")

    spec = ToolSpec("t", "raises", {"type": "object"}, "read", raises)
    done = await execute_calls(
        [ToolCall(id="t", name="t", arguments={})],
        round=1,
        registry=ToolRegistry([spec]),
        ctx=ToolContext(user_id="u"),
    )
    assert done[0].error == "t failed: upstream said 504"


async def test_a_tool_cancelled_from_inside_is_an_error_result_not_a_cancelled_run() -> None:
    async def cancels_itself(args: dict[str, Any], ctx: ToolContext) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    probe = Probe()
    spec = ToolSpec("c", "cancels", {"type": "object"}, "read", cancels_itself)
    done = await run(probe, calls("r", "c", "r"), registry=ToolRegistry([*probe.specs(), spec]))
    assert [e.ok for e in done] == [True, False, True]
    assert done[1].error == "c failed: it was cancelled from inside the tool"


async def test_cancelling_the_run_cancels_every_running_call() -> None:
    probe = Probe()

    async def hold(i: int) -> None:
        await asyncio.Event().wait()

    probe.hold = hold
    task = asyncio.create_task(
        execute_calls(
            calls("r", "r", "r", "w"),
            round=1,
            registry=ToolRegistry(probe.specs()),
            ctx=ToolContext(user_id="u"),
        )
    )
    await probe.when(lambda ev: len(ev) == 3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(i for kind, i in probe.events if kind == "cancelled") == [0, 1, 2]
    assert 3 not in probe.started(), "nothing after the cancellation starts"


async def test_a_call_that_finished_just_before_the_cancellation_is_still_reported() -> None:
    probe = Probe()
    finished = asyncio.Event()

    async def hold(i: int) -> None:
        if i == 0:
            await asyncio.Event().wait()
        finished.set()  # call 1 returns in this same step, before the shell collects it

    probe.hold = hold
    seen: list[int] = []
    task = asyncio.create_task(
        execute_calls(
            calls("r", "r"),
            round=1,
            registry=ToolRegistry(probe.specs()),
            ctx=ToolContext(user_id="u"),
            sink=on_finished(seen),
        )
    )
    await finished.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [1], "call 1 happened: whoever keeps a transcript must hear of it"
    assert ("cancelled", 0) in probe.events


async def test_a_gate_that_raises_cancels_the_running_calls_and_propagates() -> None:
    probe = Probe()

    async def hold(i: int) -> None:
        await asyncio.Event().wait()

    async def gate(spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        if call.arguments["i"] == 1:
            await probe.when(lambda ev: ("start", 0) in ev)
            raise RuntimeError("policy store down")
        return PolicyDecision(allow=True)

    probe.hold = hold
    with pytest.raises(RuntimeError, match="policy store down"):
        await run(probe, calls("r", "r"), policy=gate)
    assert probe.events == [("start", 0), ("cancelled", 0)]


# --- through the loop -------------------------------------------------------------------------


async def test_the_loop_counts_calls_exactly_and_stores_them_in_source_order() -> None:
    probe = Probe()

    async def hold(i: int) -> None:  # round 1 finishes in reverse order
        await probe.when(lambda ev: sum(k == "start" for k, _ in ev) >= 3)
        if i < 2:
            await probe.when(lambda ev: ("end", i + 1) in ev)

    probe.hold = hold
    states: list[LoopState] = []
    sink = RecordingSink()
    llm = ScriptedChatModel(
        [
            tool_calls(("r", {"i": 0}), ("r", {"i": 1}), ("r", {"i": 2})),
            tool_calls(("w", {"i": 3})),
            final_answer("done"),
        ]
    )
    result = await run_planner_loop(
        PlannerLoopInput(
            system_prompt="s",
            user_prompt="u",
            tools=probe.specs(),
            reminder_channel=lambda state: states.append(state) or [],
        ),
        llm=llm,
        sink=sink,
    )
    batches = [e.size for e in sink.of_type(ReadsOverlapped)]
    assert [s.tool_call_count for s in states] == [0, 3, 4]
    last = states[1].last_call
    assert last is not None and last.call.arguments == {"i": 2}
    assert [e.call.arguments["i"] for e in result.executed_calls] == [0, 1, 2, 3]
    assert [e.round for e in result.executed_calls] == [1, 1, 1, 2]
    tool_ids = [m.tool_call_id for m in result.messages if m.role == "tool"]
    assert tool_ids == [e.call.id for e in result.executed_calls]
    assert batches == [3]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_parallel_reads", 0, "max_parallel_reads must be >= 1"),
        ("max_rounds", 0, "max_rounds must be >= 1"),
    ],
)
def test_loop_limits_are_checked(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlannerLoopInput(system_prompt="s", user_prompt="u", **{field: value})


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan")])
def test_a_tool_timeout_must_be_positive(timeout_s: float) -> None:
    with pytest.raises(ToolRegistryError, match="invalid timeout_s for tool 'x'"):
        ToolSpec("x", "x", {"type": "object"}, "read", Probe().handler, timeout_s=timeout_s)


async def test_a_handler_that_swallows_its_timeout_leaves_no_cancellation_behind() -> None:
    async def stubborn(args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "I ignored the timeout"
        return "slept"

    spec = ToolSpec("stubborn", "s", {"type": "object"}, "read", stubborn)
    [executed] = await execute_calls(
        [ToolCall(id="c", name="stubborn", arguments={})],
        round=1,
        registry=ToolRegistry([spec]),
        ctx=ToolContext(user_id="u"),
        tool_timeout_s=0.01,
    )
    assert executed.result == "I ignored the timeout"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # a later await is not hit by the swallowed cancellation


async def test_a_handler_that_returns_a_future_gets_its_result_and_its_timeout() -> None:
    loop = asyncio.get_running_loop()

    def answered(args: dict[str, Any], ctx: ToolContext) -> asyncio.Future[str]:
        future: asyncio.Future[str] = loop.create_future()
        loop.call_soon(future.set_result, "answered")
        return future

    def unanswered(args: dict[str, Any], ctx: ToolContext) -> asyncio.Future[str]:
        return loop.create_future()

    specs = [
        ToolSpec("a", "a", {"type": "object"}, "read", answered),
        ToolSpec("u", "u", {"type": "object"}, "read", unanswered),
    ]
    done = await execute_calls(
        [ToolCall(id="a", name="a", arguments={}), ToolCall(id="u", name="u", arguments={})],
        round=1,
        registry=ToolRegistry(specs),
        ctx=ToolContext(user_id="u"),
        tool_timeout_s=0.01,
    )
    assert [e.result for e in done] == ["answered", None]
    assert done[1].error == "u timed out after 0.01 s and was stopped; it returned nothing"


async def test_a_handler_that_waits_after_working_past_its_timeout_is_stopped_there() -> None:
    """A handler that worked past its timeout without waiting is stopped at its first wait."""
    gate = asyncio.Event()

    async def slow_then_waits(args: dict[str, Any], ctx: ToolContext) -> str:
        loop = asyncio.get_running_loop()
        busy_until = loop.time() + 0.05
        while loop.time() < busy_until:  # works without waiting, past its 0.01 s
            pass
        await gate.wait()  # never set: only the deadline ends this wait
        return "waited"

    spec = ToolSpec("s", "s", {"type": "object"}, "read", slow_then_waits, timeout_s=0.01)
    [executed] = await asyncio.wait_for(
        execute_calls(
            [ToolCall(id="s", name="s", arguments={})],
            round=1,
            registry=ToolRegistry([spec]),
            ctx=ToolContext(user_id="u"),
        ),
        HANG_GUARD_S,
    )
    assert executed.error == "s timed out after 0.01 s and was stopped; it returned nothing"
