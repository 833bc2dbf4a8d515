"""Run one round's tool calls and turn each into exactly one tool result message.

Every call the model issued gets one result, whatever happens: an unknown tool, arguments that
are not valid JSON or fail the tool's schema, a policy denial, a handler that raises and a
handler that runs past its timeout all become an *error tool result* that the model reads on
the next round. Nothing here raises for those; only cancellation of the whole run and
``RunInterrupted`` (an infrastructure fault a journal, the gate or a tool reports: not the
model's to handle) propagate, and cancel every call still running.

How a round runs (the plan is the pure function ``plan_segments``, the shell is
``execute_calls``):

* Consecutive ``read`` calls form one *parallel segment*: they run concurrently, at most
  ``max_parallel_reads`` at a time, in a sliding window (a finished call's slot is refilled at
  once). A ``write`` or ``destructive`` call is a *barrier*: it starts after every call before
  it finished, and nothing after it starts before it finished.
* A handler that raises gives the model ``"<tool> failed: <the exception's message>"`` (a
  ``ToolError``'s message as it is): plain words, never a Python class name.
* The calls of a parallel segment run in an ``asyncio.TaskGroup``, an ``asyncio.Semaphore``
  holding them to the cap; a segment of one call (or a cap of 1) runs in the round's own task.
* Checks and the policy gate take every call in source order, one at a time, before it
  starts (a read waiting for a free slot has been decided already; a write or destructive call
  is decided once every call before it finished); a call that fails them gets its error
  result and takes no slot.
* Results come back in source order, whatever order the calls finished in; the run events
  (``planner.events``: ``CallDecided``, ``CallStarted``, ``CallFinished``, ``ReadsOverlapped``)
  go to the sink as they happen, ``CallFinished`` in completion order.
* A call the gate *asks* about (verdict ``ask`` in ``enforce``: a destructive call waiting for
  a person's approval, ``planner.approvals``) parks the round there: it does not run, no call
  after it is checked or started, and ``execute_round`` says so (``ExecutedRound.parked``);
  the calls before it have finished (it is a barrier). With ``park=False`` (a consumer that
  cannot wait: an MCP client) such a call is refused instead, its result saying why.
* A ``write`` or ``destructive`` call gets its own idempotency key in ``ctx``; its
  ``CallStarted`` is awaited before its handler starts, so a sink (the worker's journal) can
  record it durably first, and a worker taking over after a crash knows which writes were in
  flight (``planner.loop`` resumes from such a record). A sink that raises for it keeps the
  call from running.

The model of this split (a pure segmentation, then a thin async shell) is pydantic-ai's
``_tool_execution.py`` (``_segment_by_barriers``); one call's checks and run are
``planner.call_execution``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from planner.call_execution import (
    ParkedCall,
    ReadyCall,
    ToolCallExecutor,
    check_call,
    described,
    run_call,
)
from planner.calls import ExecutedCall
from planner.events import ApprovalRequested, CallFinished, ReadsOverlapped
from planner.messages import ToolCall
from planner.policy import PolicyGate
from planner.tools import PolicyHint, ToolContext, ToolRegistry

if TYPE_CHECKING:
    from planner.approvals import Approval
    from planner.events import RunSink

__all__ = [
    "DEFAULT_MAX_PARALLEL_READS",
    "DEFAULT_TOOL_TIMEOUT_S",
    "ExecutedRound",
    "Segment",
    "ToolCallExecutor",
    "execute_calls",
    "execute_round",
    "plan_segments",
]

DEFAULT_MAX_PARALLEL_READS = 10
"""Read calls of one round that may run at once, unless the caller says otherwise."""

DEFAULT_TOOL_TIMEOUT_S = 60.0
"""Seconds one tool call may run when neither its ToolSpec nor the caller sets a limit."""


# --- the plan (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """Calls of one round that run under one rule.

    Attributes:
        parallel: ``True`` for consecutive reads (run concurrently, up to the cap); ``False``
            for one barrier call (``write`` or ``destructive``) that runs alone.
        indices: 0-based positions of the calls in the round, in source order.
    """

    parallel: bool
    indices: tuple[int, ...]


def plan_segments(hints: Sequence[PolicyHint | None]) -> list[Segment]:
    """Split a round's calls into segments that run one after the other.

    Args:
        hints: the policy hint of each call, in source order; ``None`` for a call that cannot
            run (an unknown tool): it has no effect, so it is planned like a read.

    Returns:
        Segments covering every index exactly once, in source order: each maximal run of
        reads is one parallel segment, each ``write`` / ``destructive`` call a segment of its
        own. ``[]`` for no calls.
    """
    segments: list[Segment] = []
    reads: list[int] = []
    for index, hint in enumerate(hints):
        if hint in ("write", "destructive"):
            if reads:
                segments.append(Segment(True, tuple(reads)))
                reads = []
            segments.append(Segment(False, (index,)))
        else:
            reads.append(index)
    if reads:
        segments.append(Segment(True, tuple(reads)))
    return segments


# --- the shell ----------------------------------------------------------------------------------


class ExecutedRound(NamedTuple):
    """What ``execute_round`` did: ``calls``, the outcome of every call that has one, in
    source order (all of them, unless the round parked); ``parked``, the call the gate asked
    about when the round stopped there (the calls before it are in ``calls``, those after it
    did not start), else ``None``."""

    calls: list[ExecutedCall]
    parked: ApprovalRequested | None = None


async def execute_calls(
    calls: Sequence[ToolCall],
    *,
    round: int,
    registry: ToolRegistry,
    ctx: ToolContext,
    policy: PolicyGate | None = None,
    executor: ToolCallExecutor | None = None,
    sink: RunSink | None = None,
    max_parallel_reads: int = DEFAULT_MAX_PARALLEL_READS,
    tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
    settled: Mapping[int, ExecutedCall] | None = None,
    approvals: Mapping[int, Approval] | None = None,
) -> list[ExecutedCall]:
    """Run one round's ``calls`` for a consumer that cannot wait for a person: as
    ``execute_round`` with ``park=False`` (a call the gate asks about is refused, its result
    saying so); one ExecutedCall per call, in source order."""
    executed = await execute_round(
        calls,
        round=round,
        registry=registry,
        ctx=ctx,
        policy=policy,
        executor=executor,
        sink=sink,
        max_parallel_reads=max_parallel_reads,
        tool_timeout_s=tool_timeout_s,
        settled=settled,
        approvals=approvals,
        park=False,
    )
    return executed.calls


async def execute_round(
    calls: Sequence[ToolCall],
    *,
    round: int,
    registry: ToolRegistry,
    ctx: ToolContext,
    policy: PolicyGate | None = None,
    executor: ToolCallExecutor | None = None,
    sink: RunSink | None = None,
    max_parallel_reads: int = DEFAULT_MAX_PARALLEL_READS,
    tool_timeout_s: float | None = DEFAULT_TOOL_TIMEOUT_S,
    settled: Mapping[int, ExecutedCall] | None = None,
    approvals: Mapping[int, Approval] | None = None,
    park: bool = True,
    reply_text: str | None = None,
) -> ExecutedRound:
    """Run one round's ``calls`` (the tool calls of one assistant message; the rules are in
    the module docstring).

    Args:
        round: the 1-based round number (recorded on each ExecutedCall).
        registry, ctx: the tools the model may call; the context passed to every handler.
        policy: awaited before each known tool with valid arguments runs, one call at a time
            in source order; a denial skips the handler.
        executor: when given, runs each allowed call instead of the spec's handler.
        sink: awaited with the round's call events (``CallDecided``, ``CallStarted``,
            ``CallFinished``, ``ApprovalRequested``, ``ReadsOverlapped``).
        max_parallel_reads: read calls running at once, at most (default 10, must be ≥ 1).
        tool_timeout_s: seconds a call may run when its ToolSpec sets no ``timeout_s``
            (default 60; ``None``: no limit); past it, the call is cancelled (an error result).
        settled: results already known, by 0-based position (a resumed round): not run.
        approvals: people's decisions on calls, by 0-based position (on the call's
            ``ToolContext.approval`` when the gate decides it).
        park: a call the gate asks about parks the round; ``False``: it is refused.
        reply_text: the model's text in the reply (recorded on ``ApprovalRequested``).

    Returns:
        ``ExecutedRound``: an ExecutedCall per call in source order (up to a parked call).

    Raises:
        ValueError: ``max_parallel_reads`` < 1 or ``tool_timeout_s`` ≤ 0.
        asyncio.CancelledError, RunInterrupted, or what ``policy`` or the sink raise: the
        calls still running are cancelled and awaited first.
    """
    if max_parallel_reads < 1:
        raise ValueError(f"max_parallel_reads must be >= 1, got {max_parallel_reads}")
    if tool_timeout_s is not None and not tool_timeout_s > 0:
        raise ValueError(f"tool_timeout_s must be > 0 or None, got {tool_timeout_s}")
    under_way = _Round(calls, round, registry, ctx, policy, executor, sink, tool_timeout_s)
    under_way.settled, under_way.approvals, under_way.park = settled, approvals, park
    under_way.reply_text = reply_text
    return await under_way.run(max_parallel_reads)


@dataclass
class _Round:
    """One round under way: its calls and their configuration (``execute_round``'s
    arguments), their outcomes so far, and where it parked."""

    calls: Sequence[ToolCall]
    round: int
    registry: ToolRegistry
    ctx: ToolContext
    policy: PolicyGate | None
    executor: ToolCallExecutor | None
    sink: RunSink | None
    tool_timeout_s: float | None
    settled: Mapping[int, ExecutedCall] | None = None
    approvals: Mapping[int, Approval] | None = None
    park: bool = True
    reply_text: str | None = None
    parked: ApprovalRequested | None = None

    def __post_init__(self) -> None:
        self.specs = [self.registry.get(call.name) for call in self.calls]  # None: unknown
        self.results: list[ExecutedCall | None] = [None] * len(self.calls)

    async def run(self, max_parallel_reads: int) -> ExecutedRound:
        """Run the segments one after the other, until the last or a parked call."""
        hints = [None if spec is None else spec.policy_hint for spec in self.specs]
        for segment in plan_segments(hints):
            cap = max_parallel_reads if segment.parallel else 1
            if cap == 1 or len(segment.indices) == 1:
                await self.run_alone(segment.indices)  # nothing can overlap: no tasks
            else:
                started = await self.run_overlapping(segment.indices, cap)
                if started > 1 and self.sink is not None:
                    await self.sink(ReadsOverlapped(self.round, started))
            if self.parked is not None:
                break
        done = [executed for executed in self.results if executed is not None]
        if self.parked is not None:
            stop = self.parked.position
            if len(done) != stop or any(c.index >= stop for c in done):  # a bug here
                raise AssertionError(f"parked at call {stop} but {len(done)} results")
            return ExecutedRound(done, self.parked)
        if len(done) != len(self.calls):  # a bug here, never the tool's fault
            raise AssertionError(f"{len(self.calls)} calls but {len(done)} results")
        return ExecutedRound(done)

    async def run_alone(self, indices: Sequence[int]) -> None:
        """Check and run the calls one at a time, in the round's task."""
        for index in indices:
            checked = await self.check(index)
            if checked is None:
                break
            if isinstance(checked, ExecutedCall):
                await self.finish(checked)
            else:
                await self.start(checked)

    async def run_overlapping(self, indices: Sequence[int], cap: int) -> int:
        """Check the calls in source order and start each in a task of its own as soon as
        one of ``cap`` slots is free; returns how many started. Any exception cancels and
        awaits the calls running, and propagates as itself (not as an exception group)."""
        # the cap binds only when the segment has more reads than slots
        slots = asyncio.Semaphore(cap) if len(indices) > cap else None
        started = 0

        async def in_slot(ready: ReadyCall, slots: asyncio.Semaphore) -> None:
            try:
                await self.start(ready)
            finally:
                slots.release()

        try:
            async with asyncio.TaskGroup() as group:
                for index in indices:
                    checked = await self.check(index)
                    if checked is None:
                        break
                    if isinstance(checked, ExecutedCall):
                        await self.finish(checked)
                        continue
                    if slots is None:
                        group.create_task(self.start(checked))
                    else:
                        await slots.acquire()
                        group.create_task(in_slot(checked, slots))
                    started += 1
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None  # what a round run one call at a time raises
        return started

    async def check(self, index: int) -> ExecutedCall | ReadyCall | None:
        """The call's known or error result, or the call ready to run; ``None`` once the
        round parked (at this call or before it)."""
        if self.parked is not None:
            return None
        if self.settled and index in self.settled:
            return self.settled[index]
        approval = self.approvals.get(index) if self.approvals else None
        checked = await check_call(
            index,
            self.calls[index],
            self.specs[index],
            round=self.round,
            registry=self.registry,
            ctx=self.ctx,
            policy=self.policy,
            sink=self.sink,
            approval=approval,
            park=self.park,
        )
        if isinstance(checked, ParkedCall):
            call, decision = checked
            target = await described(self.specs[index], call, self.ctx.for_call(self.round, index))
            self.parked = ApprovalRequested(
                self.round, index, call, decision, self.reply_text, target
            )
            if self.sink is not None:
                await self.sink(self.parked)
            return None
        return checked

    async def start(self, ready: ReadyCall) -> None:
        """Run a ready call and report its outcome."""
        executed = await run_call(
            ready,
            round=self.round,
            executor=self.executor,
            default_timeout_s=self.tool_timeout_s,
            sink=self.sink,
        )
        await self.finish(executed)

    async def finish(self, executed: ExecutedCall) -> None:
        """Keep a call's outcome and report it (``CallFinished``)."""
        self.results[executed.index] = executed
        if self.sink is not None:
            settled = self.settled is not None and self.settled.get(executed.index) is executed
            await self.sink(CallFinished(executed, settled))
