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
``_tool_execution.py`` (``_segment_by_barriers``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from planner.calls import ExecutedCall, denial_text
from planner.deadline import Deadline, resumed
from planner.errors import RunInterrupted, ToolError
from planner.events import (
    ApprovalRequested,
    CallDecided,
    CallFinished,
    CallStarted,
    ReadsOverlapped,
)
from planner.messages import ToolCall
from planner.policy import PolicyDecision, PolicyGate
from planner.tools import PolicyHint, ToolContext, ToolRegistry, ToolSpec

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

ToolCallExecutor = Callable[[ToolCall], Awaitable[Any]]

logger = logging.getLogger(__name__)

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


class _Ready(NamedTuple):
    """A call that passed the checks and the gate, about to start (a named tuple: built for
    every call, it must be cheap); ``ctx`` is the call's own (its key, its approval)."""

    position: int
    call: ToolCall
    spec: ToolSpec
    decision: PolicyDecision | None
    checked_ms: float
    ctx: ToolContext


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
    """Run one round's ``calls`` (see the module docstring for the rules).

    Args:
        calls: the tool calls of one assistant message.
        round: the 1-based round number (recorded on each ExecutedCall).
        registry: the tools the model may call.
        ctx: passed to every handler.
        policy: awaited before each known tool with valid arguments runs, one call at a time
            in source order; a denial skips the handler.
        executor: when given, runs each allowed call instead of the spec's handler.
        sink: gets the round's call events (``CallDecided``, ``CallStarted``,
            ``CallFinished``, ``ReadsOverlapped``); an awaitable it returns is awaited.
        max_parallel_reads: read calls running at once, at most (default 10, must be ≥ 1).
        tool_timeout_s: seconds a call may run when its ToolSpec sets no ``timeout_s``
            (default 60; ``None``: no limit). A call past its limit is cancelled and gets an
            error result; for a write the error says its outcome is unknown.
        settled: results already known, by 0-based position (a resumed round: calls an
            earlier attempt finished, or whose outcome is unknown); those calls do not run.
        approvals: people's decisions on calls of this round, by 0-based position: each is
            on its call's ``ToolContext.approval`` when the gate decides it.
        park: a call the gate asks about (``PolicyDecision.parks``) parks the round (the
            default); ``False``: it is refused like a denied call.
        reply_text: the model's text in the reply that issued ``calls`` (recorded with a
            parked call's ``ApprovalRequested``).

    Returns:
        ``ExecutedRound``: one ExecutedCall per call in source order, or, when the round
        parked, those of the calls before the parked one and the ``ApprovalRequested`` event
        (already given to the sink).

    Raises:
        ValueError: ``max_parallel_reads`` < 1 or ``tool_timeout_s`` ≤ 0.
        asyncio.CancelledError: the run was cancelled; every call still running is cancelled
            and awaited first.
        RunInterrupted: the sink, the gate or a handler said the run cannot go on (its
            database is unreachable); the calls still running are cancelled first.
        Whatever ``policy`` or the sink raise for other events (operator bugs, not tool
        failures).
    """
    if max_parallel_reads < 1:
        raise ValueError(f"max_parallel_reads must be >= 1, got {max_parallel_reads}")
    if tool_timeout_s is not None and not tool_timeout_s > 0:
        raise ValueError(f"tool_timeout_s must be > 0 or None, got {tool_timeout_s}")
    results: list[ExecutedCall | None] = [None] * len(calls)
    parked: list[ApprovalRequested] = []

    def finish(executed: ExecutedCall) -> Awaitable[None] | None:
        results[executed.index] = executed
        if sink is None:
            return None
        was_settled = settled is not None and settled.get(executed.index) is executed
        return sink(CallFinished(executed, was_settled))

    async def check(index: int) -> ExecutedCall | _Ready | None:
        if parked:
            return None  # the round stopped at a call waiting for approval
        if settled and index in settled:
            return settled[index]
        checked = await _check(
            index,
            calls[index],
            specs[index],
            round=round,
            registry=registry,
            ctx=ctx,
            policy=policy,
            sink=sink,
            approval=approvals.get(index) if approvals else None,
            park=park,
        )
        if isinstance(checked, _Parked):
            event = ApprovalRequested(round, index, checked.call, checked.decision, reply_text)
            parked.append(event)
            if sink is not None and (pending := sink(event)) is not None:
                await pending
            return None
        return checked

    def run(ready: _Ready) -> Coroutine[Any, Any, ExecutedCall]:
        return _run(
            ready,
            round=round,
            executor=executor,
            default_timeout_s=tool_timeout_s,
            sink=sink,
        )

    specs = [registry.get(call.name) for call in calls]  # None: an unknown tool
    hints = [None if spec is None else spec.policy_hint for spec in specs]
    segments = (
        plan_segments(hints) if "write" in hints or "destructive" in hints else _reads(len(hints))
    )
    for segment in segments:
        cap = max_parallel_reads if segment.parallel else 1
        ran = await _run_segment(segment.indices, cap, check, run, finish)
        if segment.parallel and cap > 1 and ran > 1 and sink is not None:
            if (pending := sink(ReadsOverlapped(round, ran))) is not None:
                await pending
        if parked:
            break
    done = [executed for executed in results if executed is not None]
    if parked:
        stop = parked[0].position
        if len(done) != stop or any(c.index >= stop for c in done):  # a bug here
            raise AssertionError(f"parked at call {stop} but {len(done)} results")
        return ExecutedRound(done, parked[0])
    if len(done) != len(calls):  # a bug here, never the tool's fault
        raise AssertionError(f"{len(calls)} calls but {len(done)} results")
    return ExecutedRound(done)


@lru_cache(maxsize=32)
def _reads(size: int) -> tuple[Segment, ...]:
    """``plan_segments`` of ``size`` calls none of which is a write or destructive (made once
    per size: a round of reads is the common case)."""
    return tuple(plan_segments(["read"] * size))


async def _run_segment(
    indices: Sequence[int],
    cap: int,
    check: Callable[[int], Awaitable[ExecutedCall | _Ready | None]],
    run: Callable[[_Ready], Coroutine[Any, Any, ExecutedCall]],
    finish: Callable[[ExecutedCall], Awaitable[None] | None],
) -> int:
    """Check the calls in source order and start each one as soon as a slot is free (at most
    ``cap`` running); a check that answers ``None`` (the round parked) starts nothing more,
    and the calls running are waited for. Returns how many handlers were started. On any
    exception (cancellation included) the running calls are cancelled and awaited before it
    propagates; calls that finished before the cancellation reached them are still passed to
    ``finish``."""
    started = 0
    if cap == 1 or len(indices) == 1:
        # nothing can overlap: run inline, without the cost of a task per call
        for index in indices:
            checked = await check(index)
            if checked is None:
                break
            if isinstance(checked, ExecutedCall):
                if (pending := finish(checked)) is not None:
                    await pending
            else:
                started += 1
                if (pending := finish(await run(checked))) is not None:
                    await pending
        return started
    loop = asyncio.get_running_loop()
    running: dict[int, asyncio.Task[ExecutedCall]] = {}  # by the call's position
    # the positions of the calls that finished, in the order they did: each task says so as
    # its last step, and the first wakes this one (what asyncio.wait learns, without its
    # future and callbacks per task and per wait, nor an event-loop turn for done callbacks)
    finished: list[int] = []
    waiter: asyncio.Future[None] | None = None

    async def tracked(ready: _Ready) -> ExecutedCall:
        try:
            return await run(ready)
        finally:  # the task ends with this step: it is done when this one wakes
            finished.append(ready.position)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def collect() -> None:
        """Wait until a call finished (unless one did), then report every finished one."""
        nonlocal waiter
        if not finished:
            waiter = loop.create_future()
            try:
                await waiter
            finally:
                waiter = None
        while finished:
            task = running.pop(finished.pop(0))
            # _run turns every failure into a value
            if (pending := finish(task.result())) is not None:
                await pending

    try:
        for index in indices:
            checked = await check(index)
            if checked is None:
                break
            if isinstance(checked, ExecutedCall):
                if (pending := finish(checked)) is not None:
                    await pending
                continue
            while len(running) >= cap:
                await collect()
            running[index] = loop.create_task(tracked(checked))
            started += 1
        while running:
            await collect()
    finally:
        left = list(running.values())
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
            for task in left:  # done before the cancellation reached it: it happened
                if not task.cancelled() and task.exception() is None:
                    if (pending := finish(task.result())) is not None:
                        await pending
    return started


class _Parked(NamedTuple):
    """A call the gate asked about: it waits for a person's approval."""

    call: ToolCall
    decision: PolicyDecision


async def _check(
    index: int,
    call: ToolCall,
    spec: ToolSpec | None,
    *,
    round: int,
    registry: ToolRegistry,
    ctx: ToolContext,
    policy: PolicyGate | None,
    sink: RunSink | None = None,
    approval: Approval | None = None,
    park: bool = True,
) -> ExecutedCall | _Ready | _Parked:
    """The call's error result when it cannot run, ``_Parked`` when it waits for approval,
    else what it needs to start (``spec``: the registry's tool of that name, ``None`` for an
    unknown tool). The gate sees the call's own context (its idempotency key, for a write;
    its approval)."""
    started = time.perf_counter()

    def refused(error: str, decision: PolicyDecision | None) -> ExecutedCall:
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        return ExecutedCall(round, call, None, error, decision, elapsed_ms, index)

    if spec is None:
        known = ", ".join(registry.names()) or "(none)"
        return refused(f"unknown tool {call.name!r}; available tools: {known}", None)
    if call.parse_error is not None:
        return refused(f"could not parse the arguments for {call.name}: {call.parse_error}", None)
    invalid = spec.validate_arguments(call.arguments)
    if invalid is not None:
        return refused(invalid, None)
    decision: PolicyDecision | None = None
    own = ctx if spec.policy_hint == "read" else ctx.for_call(round, index, approval)
    if policy is not None:
        decision = await policy(spec, call, own)
        if sink is not None:
            if (pending := sink(CallDecided(round, index, call, decision))) is not None:
                await pending
        if not decision.allow:
            if park and decision.parks:
                return _Parked(call, decision)
            return refused(denial_text(decision), decision)
    return _Ready(index, call, spec, decision, (time.perf_counter() - started) * 1000.0, own)


async def _run(
    ready: _Ready,
    *,
    round: int,
    executor: ToolCallExecutor | None,
    default_timeout_s: float | None,
    sink: RunSink | None = None,
) -> ExecutedCall:
    """Run one allowed call under its timeout, with its own context (``ready.ctx``: a write's
    idempotency key, the call's approval); every failure becomes the error result.
    ``CallStarted`` is awaited first: a sink that raises keeps the call from running."""
    call, spec = ready.call, ready.spec
    timeout_s = spec.timeout_s if spec.timeout_s is not None else default_timeout_s
    started = time.perf_counter()

    def done(result: Any, error: str | None, ran: bool = True) -> ExecutedCall:
        elapsed_ms = ready.checked_ms + (time.perf_counter() - started) * 1000.0
        return ExecutedCall(
            round, call, result, error, ready.decision, elapsed_ms, ready.position, ran=ran
        )

    ctx = ready.ctx
    if sink is not None:
        event = CallStarted(
            round, ready.position, call, spec.policy_hint, ctx.idempotency_key, ready.decision
        )
        try:
            if (pending := sink(event)) is not None:
                await pending
        except RunInterrupted:
            raise  # the runner's to recover from, never the model's
        except Exception as exc:  # not recorded, not run: a write must never run unrecorded
            logger.warning("%s was not run: its start could not be recorded: %s", call.name, exc)
            return done(None, f"{call.name} was not run: its start could not be recorded", False)
    return await _run_handler(ready, ctx, executor, timeout_s, done)


async def _run_handler(
    ready: _Ready,
    ctx: ToolContext,
    executor: ToolCallExecutor | None,
    timeout_s: float | None,
    done: Callable[[Any, str | None], ExecutedCall],
) -> ExecutedCall:
    call, spec = ready.call, ready.spec
    # the timer is set when the handler first waits: until then nothing can cancel it (the
    # event loop is not running), and a handler that returns without waiting needs none
    deadline = Deadline(timeout_s, armed=False)
    try:
        if executor is not None:
            awaitable = executor(call)
        else:
            awaitable = spec.handler(dict(call.arguments), ctx)
        if type(awaitable) is types.CoroutineType:
            try:
                first = awaitable.send(None)  # as await starts it
            except StopIteration as stop:  # done without waiting: no timer was needed
                result = stop.value
            else:
                deadline.arm()
                result = await resumed(awaitable, first)
        else:
            deadline.arm()
            result = await awaitable
    except asyncio.CancelledError:
        if deadline.expired_here():
            return done(None, _timeout_error(spec, timeout_s))
        this_task = asyncio.current_task()
        if this_task is not None and this_task.cancelling():
            raise  # the run (or this round) is being cancelled: not the tool's failure
        # the handler itself raised CancelledError (e.g. it awaited a cancelled future)
        return done(None, f"{call.name} failed: it was cancelled from inside the tool")
    except RunInterrupted:
        raise  # the tool's infrastructure failed: the run stops and resumes later
    except ToolError as exc:  # the handler's own words
        return done(None, str(exc))
    except Exception as exc:  # a tool failure is feedback for the model, not a crash
        # the model reads plain words, not the exception's class (the log has it)
        logger.info("%s raised %s: %s", call.name, type(exc).__name__, exc)
        reason = str(exc).strip() or "it stopped with an error and no message"
        return done(None, f"{call.name} failed: {reason}")
    finally:
        deadline.cancel()
    return done(result, None)


def _timeout_error(spec: ToolSpec, timeout_s: float | None) -> str:
    text = f"{spec.name} timed out after {timeout_s:g} s and was stopped"
    if spec.policy_hint == "read":
        return f"{text}; it returned nothing"
    return (
        f"{text}; its outcome is unknown: the {spec.policy_hint} may or may not have taken "
        "effect, check before retrying it"
    )
