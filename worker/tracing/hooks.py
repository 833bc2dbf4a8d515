"""Where the runner and the chat models meet tracing, without loading OpenTelemetry.

* ``traced_run(tracing, mission, iteration, model, sink, tools)``: the context a run of the
  planner loop goes in; yields the sink to give the loop. With ``tracing=None`` (off) it
  yields ``sink`` itself (``contextlib.nullcontext``); else ``tracing.run(...)`` opens the
  run's ``invoke_agent`` span and yields a sink that also turns the events into spans
  (``tools``: the names of the tools the run offers; a call to any other name is content).
* ``note_retry`` / ``note_fallback``: called by the chat models' retry and fallback hooks
  (``worker.llm.chat_models``); they add an event to the ``chat`` span of the request under
  way in this task, when there is one (``CURRENT_CHAT_SPAN``, set by ``TracedChatModel``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from planner import RunSink
    from worker.store.records import ClaimedMission, StartedIteration

__all__ = ["CURRENT_CHAT_SPAN", "RunTracing", "note_fallback", "note_retry", "traced_run"]


class RunTracing(Protocol):
    """What traces a mission's run (``worker.tracing.run_spans.RunTracer``)."""

    def run(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        model: str | None,
        sink: RunSink,
        tools: Collection[str] = (),
    ) -> AbstractAsyncContextManager[RunSink]:
        """The run's span around the loop; yields the sink to give the loop. ``tools``: the
        names of the tools the run offers."""
        ...


def traced_run(
    tracing: RunTracing | None,
    mission: ClaimedMission,
    iteration: StartedIteration,
    model: str | None,
    sink: RunSink,
    tools: Collection[str] = (),
) -> AbstractAsyncContextManager[RunSink]:
    """``sink`` unchanged when ``tracing`` is ``None``, else ``tracing.run(...)`` (see the
    module docstring)."""
    if tracing is None:
        return contextlib.nullcontext(sink)
    return tracing.run(mission, iteration, model, sink, tools)


CURRENT_CHAT_SPAN: ContextVar[Callable[[str, dict[str, Any]], None] | None] = ContextVar(
    "mana_ai_current_chat_span", default=None
)
"""``add_event(name, attributes)`` of the ``chat`` span of the request under way in this task
(``None``: no request is traced)."""


def note_retry(attempt: int, reason: str) -> None:
    """A chat completion attempt failed and is retried: an event on the request's span."""
    add_event = CURRENT_CHAT_SPAN.get()
    if add_event is not None:
        add_event("mana_ai.llm.retry", {"mana_ai.llm.attempt": attempt, "error.type": reason})


def note_fallback(error: Exception) -> None:
    """The primary endpoint failed the request, which goes to the fallback: an event on the
    request's span, with the primary's error class (its message may quote the endpoint)."""
    add_event = CURRENT_CHAT_SPAN.get()
    if add_event is not None:
        add_event("mana_ai.llm.fallback", {"error.type": type(error).__name__})
