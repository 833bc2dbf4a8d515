"""Fakes that implement the real protocols, for tests and benchmarks.

``ScriptedChatModel`` answers requests from a script, records every request it saw, and fails
loudly when asked for more steps than scripted; ``assert_exhausted()`` fails the test when
scripted steps were left over. ``FunctionChatModel`` answers with a function of the request.
``InMemoryCallLedger`` is the policy gate's rate-limit ledger for one process;
``RecordingSink`` keeps a run's events and folds them into its record.
Nothing here opens a socket.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from planner.events import CallStarted, RunEvent
from planner.gate import Reservation
from planner.llm import CompletionRequest, CompletionResponse
from planner.messages import ChatMessage, TokenUsage, ToolCall
from planner.policy import RateLimit
from planner.record import RunLog, RunRecord

E = TypeVar("E")

__all__ = [
    "FunctionChatModel",
    "InMemoryCallLedger",
    "RecordingSink",
    "ScriptExhaustedError",
    "ScriptStep",
    "ScriptedChatModel",
    "final_answer",
    "tool_calls",
]

_ids = itertools.count(1)


def tool_calls(
    *calls: tuple[str, dict[str, Any]], usage: TokenUsage | None = None, text: str | None = None
) -> CompletionResponse:
    """A response whose assistant message calls ``(name, arguments)`` pairs, in order, with
    ``text`` as its content (default none)."""
    message = ChatMessage(
        role="assistant",
        content=text,
        tool_calls=tuple(ToolCall(id=f"call_{next(_ids)}", name=n, arguments=a) for n, a in calls),
    )
    return CompletionResponse(
        message=message,
        usage=usage or TokenUsage(prompt_tokens=10, completion_tokens=5),
        finish_reason="tool_calls",
    )


def final_answer(text: str, usage: TokenUsage | None = None) -> CompletionResponse:
    """A response whose assistant message answers ``text`` without tool calls."""
    return CompletionResponse(
        message=ChatMessage(role="assistant", content=text),
        usage=usage or TokenUsage(prompt_tokens=10, completion_tokens=5),
        finish_reason="stop",
    )


ScriptStep = (
    CompletionResponse
    | BaseException
    | Callable[[CompletionRequest], CompletionResponse | Awaitable[CompletionResponse]]
)
"""A response to return, an exception to raise, or a function of the request."""


class ScriptExhaustedError(AssertionError):
    """The model was asked for more completions than were scripted."""


class ScriptedChatModel:
    """A ChatModel that plays a script, one step per request.

    Args:
        steps: the replies (or exceptions to raise, or ``request -> reply`` functions), in
            order.
        unused_ok: a test where steps may be left over (a run stopped early on purpose) says
            so; otherwise ``assert_exhausted`` fails on leftovers (this project's test suite
            calls it on every scripted model when the test ends).

    Attributes:
        requests: every CompletionRequest received, in order (reminders included).
    """

    def __init__(self, steps: Iterable[ScriptStep], *, unused_ok: bool = False) -> None:
        self._steps = list(steps)
        self._next = 0
        self.unused_ok = unused_ok
        self.requests: list[CompletionRequest] = []

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Play the next step. Raises ScriptExhaustedError past the end of the script."""
        self.requests.append(request)
        if self._next >= len(self._steps):
            raise ScriptExhaustedError(
                f"request {len(self.requests)} but only {len(self._steps)} steps were scripted"
            )
        step = self._steps[self._next]
        self._next += 1
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, CompletionResponse):
            return step
        answer = step(request)
        if asyncio.iscoroutine(answer) or isinstance(answer, Awaitable):
            return await answer
        return answer

    @property
    def remaining(self) -> int:
        """Scripted steps not yet played."""
        return len(self._steps) - self._next

    def assert_exhausted(self) -> None:
        """Fail (AssertionError) when scripted steps were left over (unless ``unused_ok``)."""
        if self.remaining and not self.unused_ok:
            raise AssertionError(f"{self.remaining} scripted step(s) were never requested")


class FunctionChatModel:
    """A ChatModel that answers every request with ``fn(request)`` (sync or async)."""

    def __init__(
        self,
        fn: Callable[[CompletionRequest], CompletionResponse | Awaitable[CompletionResponse]],
    ) -> None:
        self._fn = fn
        self.requests: list[CompletionRequest] = []

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Return ``fn(request)``, awaited if it is awaitable."""
        self.requests.append(request)
        answer = self._fn(request)
        if isinstance(answer, Awaitable):
            return await answer
        return answer


class InMemoryCallLedger:
    """A ``planner.gate.CallLedger`` in memory, exact within one process (one event loop).

    Args:
        clock: UTC-aware now (default: the system clock); tests pass a fake one.

    Attributes:
        slots_taken: how many slots were taken in all.
        fail_with: when set, ``reserve`` raises it (to test a gate whose ledger is down).
    """

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self.clock = clock or partial(datetime.now, UTC)
        self.slots_taken = 0
        self.fail_with: BaseException | None = None
        self._calls: dict[tuple[str, str], deque[datetime]] = {}

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        """Count and (when a slot is free) take one, with no await in between."""
        if self.fail_with is not None:
            raise self.fail_with
        now = self.clock()
        key = (user_id, tool)
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = deque()
        start = now - limit.window
        while calls and calls[0] <= start:
            calls.popleft()
        if len(calls) < limit.calls:
            calls.append(now)
            self.slots_taken += 1
            return Reservation(True, now, ())
        return Reservation(reserved=False, now=now, recent=tuple(calls)[-limit.calls :])


class RecordingSink:
    """A ``planner.events.RunSink`` that keeps every event in order (``events``) and folds
    them into the record (``log``, ``record``).

    Attributes:
        fail_start_with: when set, ``CallStarted`` of a ``write`` or ``destructive`` call
            raises it (what a journal does when it cannot record a write: the call must then
            not run).
    """

    def __init__(self) -> None:
        self.events: list[RunEvent] = []
        self.log = RunLog()
        self.fail_start_with: BaseException | None = None

    async def __call__(self, event: RunEvent) -> None:
        """Keep ``event`` (or raise ``fail_start_with`` for a write's start)."""
        self.events.append(event)
        self.log.apply(event)
        if (
            self.fail_start_with is not None
            and isinstance(event, CallStarted)
            and event.hint != "read"
        ):
            raise self.fail_start_with

    def of_type(self, kind: type[E]) -> list[E]:
        """The events of type ``kind``, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def record(self) -> RunRecord:
        """The record of the events so far."""
        return self.log.snapshot()
