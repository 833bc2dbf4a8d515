"""Check and run one tool call: the steps every call of a round goes through
(``planner.execution`` runs a round's calls through them, alone or overlapping).

``check_call`` takes a call from the model's reply to one of three outcomes: its error result
(an unknown tool, arguments that are not JSON or fail the tool's schema, a denial by the
gate), ``ParkedCall`` (the gate asks a person about it) or ``ReadyCall`` (it may run).
``run_call`` runs a ready call's handler under ``asyncio.timeout`` and turns every failure
the model should see into the call's error result: nothing here raises for a tool's failure,
only for cancellation of the run and ``RunInterrupted``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from planner.calls import ExecutedCall, denial_text
from planner.errors import RunInterrupted, ToolError
from planner.events import CallDecided, CallStarted
from planner.messages import ToolCall
from planner.policy import DecisionReason, PolicyDecision, PolicyGate, PolicyVerdict
from planner.tools import ToolContext, ToolRegistry, ToolSpec

if TYPE_CHECKING:
    from planner.approvals import Approval
    from planner.events import RunSink

__all__ = [
    "DESCRIBE_TIMEOUT_S",
    "ParkedCall",
    "ReadyCall",
    "ToolCallExecutor",
    "check_call",
    "described",
    "run_call",
]

ToolCallExecutor = Callable[[ToolCall], Awaitable[Any]]
"""``call -> result``: runs an allowed call instead of its tool's handler (``planner.loop``'s
``on_tool_call``)."""

logger = logging.getLogger(__name__)


class ReadyCall(NamedTuple):
    """A call that passed the checks and the gate, about to start.

    Attributes:
        position: its 0-based position in the round.
        call: the model's call.
        spec: its tool.
        decision: the gate's decision (``None`` without a gate).
        checked_ms: milliseconds its checks and the gate took.
        ctx: its own context (a write's idempotency key, the call's approval).
    """

    position: int
    call: ToolCall
    spec: ToolSpec
    decision: PolicyDecision | None
    checked_ms: float
    ctx: ToolContext


class ParkedCall(NamedTuple):
    """A call the gate asked about: it waits for a person's approval."""

    call: ToolCall
    decision: PolicyDecision


UNREADABLE_TARGET = "(the tool could not say what this call acts on"
"""How a read-back that failed or timed out begins: never a target an approval can be
checked against (an approved call whose target was or is unreadable is not run)."""

DESCRIBE_TIMEOUT_S = 5.0
"""Seconds a tool's read-back of a parked call's target (``ToolSpec.describe``) may take."""

_TARGET_CHARS = 500
"""The longest read-back kept (a reviewer reads it on a card)."""


async def described(spec: ToolSpec | None, call: ToolCall, ctx: ToolContext) -> str | None:
    """What ``call`` would act on, as its tool reads it back for the person who reviews it
    (``ToolSpec.describe``, at most ``DESCRIBE_TIMEOUT_S``), cut to 500 characters; ``None``
    for a tool without one. A read-back that fails or takes too long says so instead: the
    request is made all the same. ``RunInterrupted`` from the tool (its store did not
    answer) propagates: the run stops and resumes, and the read-back is made then."""
    if spec is None or spec.describe is None:
        return None
    try:
        async with asyncio.timeout(DESCRIBE_TIMEOUT_S):
            said = await spec.describe(dict(call.arguments), ctx)
    except RunInterrupted:
        raise  # the tool's store is away: the run stops here and resumes later
    except TimeoutError:
        return f"{UNREADABLE_TARGET} within {DESCRIBE_TIMEOUT_S:g} s)"
    except Exception as exc:  # a read-back never stops the request
        return f"{UNREADABLE_TARGET}: {type(exc).__name__})"
    if said is None:
        return None
    text = str(said)
    return text if len(text) <= _TARGET_CHARS else text[: _TARGET_CHARS - 1] + "…"


async def check_call(
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
) -> ExecutedCall | ReadyCall | ParkedCall:
    """The call's error result when it cannot run, ``ParkedCall`` when it waits for approval
    (only with ``park``; else it is refused), else ``ReadyCall``. ``spec``: the registry's
    tool of that name, ``None`` for an unknown tool. The gate sees the call's own context (its
    idempotency key, for a write; ``approval``); its decision goes to ``sink`` as
    ``CallDecided``."""
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
        if decision.allow and own.approval is not None and own.approval.granted:
            decision = await _target_unchanged(spec, call, own, decision)
        if sink is not None:
            await sink(CallDecided(round, index, call, decision))
        if not decision.allow:
            if park and decision.parks:
                return ParkedCall(call, decision)
            return refused(denial_text(decision), decision)
    return ReadyCall(index, call, spec, decision, (time.perf_counter() - started) * 1000.0, own)


async def _target_unchanged(
    spec: ToolSpec, call: ToolCall, ctx: ToolContext, decision: PolicyDecision
) -> PolicyDecision:
    """``decision`` (an approved call allowed), or a denial (``approval_mismatch``) when what
    the call acts on is no longer what the person saw: the tool's read-back now
    (``described``) differs from the one on the approval card (a note
    edited, replaced or deleted since). Calls without a read-back are judged by their
    arguments alone, as before."""
    approval = ctx.approval
    if approval is None or approval.target is None or spec.describe is None:
        return decision
    now = await described(spec, call, ctx)
    unreadable = any(t.startswith(UNREADABLE_TARGET) for t in (approval.target, now or ""))
    if now == approval.target and not unreadable:
        return decision
    return decision.model_copy(
        update={
            "allow": False,
            "verdict": PolicyVerdict.DENY,
            "reason": DecisionReason.APPROVAL_MISMATCH,
            "message": (
                f"{call.name} was not run: what it acts on could not be read back to check it "
                f"against what the person saw ({approval.describe()}; then: {approval.target}; "
                f"now: {now})"
                if unreadable
                else f"{call.name} was not run: what it acts on changed since "
                f"{approval.describe()} (the person saw: {approval.target}; now: {now})"
            ),
            "reminder": (
                f"{call.name} was not run: its target changed after a person approved it. Do "
                "not retry it; say in your answer what changed."
            ),
        }
    )


async def run_call(
    ready: ReadyCall,
    *,
    round: int,
    executor: ToolCallExecutor | None,
    default_timeout_s: float | None,
    sink: RunSink | None = None,
) -> ExecutedCall:
    """Run one ready call (its handler, or ``executor``) under its timeout (the tool's
    ``timeout_s``, else ``default_timeout_s``; ``None``: no limit); every failure becomes its
    error result. ``CallStarted`` is awaited first: a sink that raises keeps the call from
    running (``RunInterrupted`` propagates).

    Raises:
        asyncio.CancelledError: the task running the call is being cancelled.
        RunInterrupted: the sink or the handler said the run cannot go on.
    """
    call, spec = ready.call, ready.spec
    timeout_s = spec.timeout_s if spec.timeout_s is not None else default_timeout_s
    started = time.perf_counter()

    def done(result: Any, error: str | None, ran: bool = True) -> ExecutedCall:
        elapsed_ms = ready.checked_ms + (time.perf_counter() - started) * 1000.0
        return ExecutedCall(
            round, call, result, error, ready.decision, elapsed_ms, ready.position, ran=ran
        )

    if sink is not None:
        event = CallStarted(
            round, ready.position, call, spec.policy_hint, ready.ctx.idempotency_key, ready.decision
        )
        try:
            await sink(event)
        except RunInterrupted:
            raise  # the runner's to recover from, never the model's
        except Exception as exc:  # not recorded, not run: a write must never run unrecorded
            logger.warning("%s was not run: its start could not be recorded: %s", call.name, exc)
            return done(None, f"{call.name} was not run: its start could not be recorded", False)
    result, error = await _handled(ready, executor, timeout_s)
    return done(result, error)


async def _handled(
    ready: ReadyCall, executor: ToolCallExecutor | None, timeout_s: float | None
) -> tuple[Any, str | None]:
    """``(result, None)``, or ``(None, what the model reads)`` when the call failed or ran
    past ``timeout_s``; cancellation of the run and ``RunInterrupted`` propagate."""
    call, spec = ready.call, ready.spec
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            if executor is not None:
                return await executor(call), None
            return await spec.handler(dict(call.arguments), ready.ctx), None
    except TimeoutError as exc:
        if timeout.expired():
            return None, _timeout_error(spec, timeout_s)
        return None, _failure_text(call, exc)  # the handler's own TimeoutError
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the run (or this round) is being cancelled: not the tool's failure
        # the handler itself raised CancelledError (e.g. it awaited a cancelled future)
        return None, f"{call.name} failed: it was cancelled from inside the tool"
    except RunInterrupted:
        raise  # the tool's infrastructure failed: the run stops and resumes later
    except ToolError as exc:  # the handler's own words
        return None, str(exc)
    except Exception as exc:  # a tool failure is feedback for the model, not a crash
        return None, _failure_text(call, exc)


def _failure_text(call: ToolCall, exc: Exception) -> str:
    """``"<tool> failed: <message>"``: plain words for the model, never the exception's class
    (the log has it)."""
    logger.info("%s raised %s: %s", call.name, type(exc).__name__, exc)
    reason = str(exc).strip() or "it stopped with an error and no message"
    return f"{call.name} failed: {reason}"


def _timeout_error(spec: ToolSpec, timeout_s: float | None) -> str:
    text = f"{spec.name} timed out after {timeout_s:g} s and was stopped"
    if spec.policy_hint == "read":
        return f"{text}; it returned nothing"
    return (
        f"{text}; its outcome is unknown: the {spec.policy_hint} may or may not have taken "
        "effect, check before retrying it"
    )
