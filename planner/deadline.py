"""A tool call's deadline and the rest of an ``await`` begun by hand: the two pieces of
asyncio machinery ``planner.execution`` runs every tool handler with.

``Deadline`` does what ``asyncio.timeout`` does at a fifth of its cost per call (measured by
``bench/tool_timeout.py``) and can be set late: only once the handler first waits, so a call
that returns without waiting sets no timer. ``resumed`` carries on an ``await`` of a
coroutine that was started with ``send(None)`` (the first step taken in the caller, to see
whether the handler waits at all).
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["Deadline", "resumed"]


@types.coroutine
def resumed(coro: Coroutine[Any, Any, Any], value: Any) -> Generator[Any, Any, Any]:
    """The rest of ``await coro`` once ``coro`` yielded ``value`` (its first wait): what
    ``await`` does (PEP 380: values it yields go to the task, values and exceptions the task
    sends or throws go back to it, ``close`` is passed on), in the task that awaits this."""
    while True:
        try:
            sent = yield value
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                value = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                value = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class Deadline:
    """Cancel the current task ``timeout_s`` seconds after this was made (``None``: never).

    What ``asyncio.timeout`` does, at a fifth of its cost per call (it runs for every tool
    call): a timer that cancels the task, and on ``CancelledError`` a check whether that timer
    was the cause — and only the cause, so a cancellation of the whole run that arrives too is
    passed on (the same ``uncancel`` bookkeeping as ``asyncio.timeout``). With
    ``armed=False`` the timer is set by ``arm`` (for the same moment: ``timeout_s`` after
    this was made), so that a call that never waits sets none.
    """

    __slots__ = (
        "_cancelling",
        "_consumed",
        "_expired",
        "_handle",
        "_started",
        "_task",
        "_timeout_s",
    )

    def __init__(self, timeout_s: float | None, *, armed: bool = True) -> None:
        self._expired = False
        self._consumed = False
        self._handle: asyncio.TimerHandle | None = None
        self._timeout_s = timeout_s
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._started = 0.0
        if armed:
            self.arm()
        elif timeout_s is not None:
            self._started = time.monotonic()

    def arm(self) -> None:
        """Set the timer (once; nothing without a timeout or outside a task), for
        ``timeout_s`` after this deadline was made, on the task running now (the one that
        awaits the call: a call runs in one task from its start to its end)."""
        if self._timeout_s is None or self._handle is not None:
            return
        task = self._task = asyncio.current_task()
        if task is None:
            return
        self._cancelling = task.cancelling()
        delay = self._timeout_s
        if self._started:
            delay -= time.monotonic() - self._started
        self._handle = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expired = True
        if self._task is not None:
            self._task.cancel()

    def expired_here(self) -> bool:
        """On ``CancelledError``: True when this deadline alone cancelled the task (the
        cancellation is then consumed)."""
        if not self._expired or self._task is None:
            return False
        self._consumed = True
        return self._task.uncancel() <= self._cancelling

    def cancel(self) -> None:
        """Stop the timer (the call finished, in time or not). A cancellation it requested
        that the handler swallowed is taken back, so it cannot hit a later await."""
        if self._handle is not None:
            self._handle.cancel()
        if self._expired and not self._consumed and self._task is not None:
            self._consumed = True
            self._task.uncancel()
