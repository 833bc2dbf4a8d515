"""A mission's run as spans, read off its run events (``planner.events``).

The tree of one run (``RunTracer.run`` opens the first span; the rest come from the events
and from ``worker.tracing.chat_spans.TracedChatModel``)::

    invoke_agent {agent}               the run of the loop (one attempt of an iteration)
    ├── chat {model}                   each LLM request of a round (TracedChatModel)
    ├── execute_tool {tool}            each tool call, refused ones too (CallFinished)
    ├── compaction                     a compaction tried before a round (Compacted /
    │   └── chat {summariser model}      CompactionFailed); its summariser's request
    └── ...

``invoke_agent`` carries who and what (``gen_ai.agent.name`` / ``.id``, ``enduser.id``, the
mission, iteration and attempt as ``mana_ai.*``, the iteration as
``gen_ai.conversation.id``), and when it ends the rounds, the stop reason, the tokens of its
requests and, on failure, ``error.type`` (the stop reason, or the exception's class: a run
cancelled by shutdown or a lost lease is ``CancelledError``) with an ``ERROR`` status.
Groups of reads that ran side by side are events on it (``mana_ai.reads_overlapped``), and so
are a call parked for a person's approval (``mana_ai.approval_requested``: its tool, round and
position; the run then stops ``awaiting_approval``) and, in the attempt that goes on, the
decision it found (``mana_ai.approval_decided``, with the request's id and status).

A call's tool is named (``gen_ai.tool.name``, and the span ``execute_tool {tool}``) only
when the run offered it: a name the model invented is content, exported as ``_OTHER`` (or, with
``MANA_AI_OTEL_CAPTURE_CONTENT``, cut and escaped) under a span named ``execute_tool``
(``worker.tracing.chosen``); the call's id, which the model or the endpoint chose, is cut and
escaped.

``execute_tool`` spans are made when the call's outcome is known, back-dated by the call's own
duration (checks, gate and handler; not the wait for a slot). They carry the policy gate's
decision (``mana_ai.policy.verdict`` / ``.reason`` / ``.mode`` / ``.flags`` / ``.markers``:
in log-only a ``deny`` verdict is a would-be denial, the call ran) and, when the call did not
succeed, an ``ERROR`` status with ``error.type``: ``denied`` (the gate refused it),
``not_run`` (unknown tool, invalid or cut arguments), ``outcome_unknown`` (a write whose
worker stopped under it) or ``tool_error`` (it raised or timed out). The error text, like
arguments and results, is recorded only with ``MANA_AI_OTEL_CAPTURE_CONTENT``. Calls an
earlier attempt settled (a resumed run) get no span: their attempt's trace has them.

A sink that traces never fails the run: an error in it is logged once and tracing of that
run stops.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Collection
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from planner import (
    CallFinished,
    CallStarted,
    ChatMessage,
    Compacted,
    CompactionFailed,
    ExecutedCall,
    ReadsOverlapped,
    ReplyJudged,
    RequestFailed,
    RequestSent,
    RunEvent,
    RunSink,
    RunStarted,
    RunStopped,
    TokenUsage,
)
from planner.events import ApprovalDecided, ApprovalRequested
from planner.replies import FAILED_STOP_REASONS
from worker.terminal_text import visible_line
from worker.tracing import content
from worker.tracing.chosen import bounded, tool_name
from worker.tracing.setup import Tracing

if TYPE_CHECKING:
    from worker.store.records import ClaimedMission, StartedIteration

__all__ = ["CURRENT_RUN", "RunSpans", "RunTracer"]

logger = logging.getLogger(__name__)

CURRENT_RUN: ContextVar[RunSpans | None] = ContextVar("mana_ai_current_run", default=None)
"""The spans of the run under way in this task (``None``: no traced run): the chat model
wrappers read the round and its reminders from it, and open the compaction span in it."""


class RunTracer:
    """Traces missions' runs (``worker.tracing.hooks.RunTracing``) with ``tracing``'s tracer;
    ``provider`` is the ``gen_ai.system`` / ``gen_ai.provider.name`` of the chat model."""

    def __init__(self, tracing: Tracing, *, provider: str) -> None:
        self.tracing = tracing
        self.provider = provider

    @contextlib.asynccontextmanager
    async def run(
        self,
        mission: ClaimedMission,
        iteration: StartedIteration,
        model: str | None,
        sink: RunSink,
        tools: Collection[str] = (),
    ) -> AsyncIterator[RunSink]:
        """The run's ``invoke_agent`` span, current while the run goes on; yields ``sink``
        composed with the one that turns the events into spans (called first). ``tools``:
        the names of the tools the run offers (any other is not exported, module docstring)."""
        spans = RunSpans(self.tracing, self.provider, mission, iteration, model, tools)
        attached = otel_context.attach(trace.set_span_in_context(spans.span))
        current = CURRENT_RUN.set(spans)
        try:
            yield spans.composed(sink)
        except BaseException as exc:
            spans.raised(exc)
            raise
        finally:
            CURRENT_RUN.reset(current)
            otel_context.detach(attached)
            spans.end()


class RunSpans:
    """The spans of one run (see the module docstring); ``observe`` takes its events."""

    def __init__(
        self,
        tracing: Tracing,
        provider: str,
        mission: ClaimedMission,
        iteration: StartedIteration,
        model: str | None,
        tools: Collection[str] = (),
    ) -> None:
        self.tracing = tracing
        self.tools = tools
        """The names of the tools the run offers."""
        self.tracer = tracing.tracer
        self.provider_attribute = tracing.conventions.provider_attribute
        self.provider = provider
        self.capture_content = tracing.capture_content
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            self.provider_attribute: provider,
            "gen_ai.agent.name": visible_line(mission.agent_name),
            "gen_ai.agent.id": str(mission.agent_id),
            "gen_ai.conversation.id": str(iteration.id),
            "enduser.id": mission.owner_user_id,
            "mana_ai.mission.id": mission.id,
            "mana_ai.iteration.id": iteration.id,
            "mana_ai.iteration.attempt": iteration.attempt,
            "mana_ai.mission.scheduled_for": mission.scheduled_for.isoformat(),
        }
        if model:
            attributes["gen_ai.request.model"] = model
        kind = SpanKind.INTERNAL if tracing.conventions.invoke_agent_internal else SpanKind.CLIENT
        self.span = self.tracer.start_span(
            f"invoke_agent {visible_line(mission.agent_name)}", kind=kind, attributes=attributes
        )
        self.context = trace.set_span_in_context(self.span)
        self.usage = TokenUsage()
        self.pending: RequestSent | None = None
        """The request about to go out (its round and reminders), until its chat span reads it."""
        self.hints: dict[tuple[int, int], str] = {}
        self.compaction: Any = None
        """The compaction span open now (opened by the summariser's request), or ``None``."""
        self.stopped: RunStopped | None = None
        self.broken = False

    def composed(self, sink: RunSink) -> RunSink:
        """``sink``, with ``observe`` called first for every event."""
        observe = self.observe

        async def traced(event: RunEvent) -> None:
            observe(event)
            await sink(event)

        return traced

    def observe(self, event: RunEvent) -> None:
        """Record ``event`` on the run's spans; never raises (module docstring)."""
        if self.broken:
            return
        try:
            self._observe(event)
        except Exception:
            self.broken = True
            logger.exception("tracing this run failed; its spans stop here")

    def _observe(self, event: RunEvent) -> None:
        match event:
            case RequestSent():
                self.pending = event
            case ReplyJudged() | RequestFailed():
                self.usage = self.usage + event.usage
            case CallStarted():
                self.hints[(event.round, event.position)] = event.hint
            case CallFinished() if not event.settled:
                self._tool_span(event)
            case ReadsOverlapped():
                self.span.add_event(
                    "mana_ai.reads_overlapped",
                    {"mana_ai.round": event.round, "mana_ai.size": event.size},
                )
            case Compacted():
                self._compacted(event)
            case CompactionFailed():
                self._compaction_failed(event)
            case RunStarted():
                self._started(event)
            case RunStopped():
                self.stopped = event
            case ApprovalRequested() | ApprovalDecided():
                self._approval_event(event)

    def _started(self, event: RunStarted) -> None:
        if event.checkpoint is not None:
            self.span.set_attribute("mana_ai.resumed_after_round", event.checkpoint.rounds_done)
        if self.capture_content:
            self.span.set_attribute("gen_ai.input.messages", content.input_messages(event.messages))

    def _approval_event(self, event: ApprovalRequested | ApprovalDecided) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.tool.name": self._tool_name(event.call.name),
            "mana_ai.round": event.round,
            "mana_ai.tool.position": event.position,
        }
        if isinstance(event, ApprovalRequested):
            self.span.add_event("mana_ai.approval_requested", attributes)
            return
        attributes["mana_ai.approval.request_id"] = event.approval.request_id
        attributes["mana_ai.approval.status"] = str(event.approval.status)
        self.span.add_event("mana_ai.approval_decided", attributes)

    def _tool_name(self, name: str) -> str:
        """``gen_ai.tool.name`` of a call to ``name`` (``worker.tracing.chosen.tool_name``)."""
        return tool_name(name, self.tools, capture_content=self.capture_content)

    def take_request(self) -> RequestSent | None:
        """The request about to go out (for its chat span), once."""
        pending, self.pending = self.pending, None
        return pending

    def open_compaction(self) -> Any:
        """The context of the compaction span, opened now unless it is open (the summariser's
        request is its child)."""
        if self.compaction is None:
            self.compaction = self.tracer.start_span(
                "compaction", context=self.context, kind=SpanKind.INTERNAL
            )
        return trace.set_span_in_context(self.compaction)

    def _compaction_span(self, round_no: int, duration_ms: float) -> Any:
        span, self.compaction = self.compaction, None
        if span is None:  # no summariser was asked (nothing to fold)
            started = time.time_ns() - int(duration_ms * 1e6)
            span = self.tracer.start_span(
                "compaction", context=self.context, kind=SpanKind.INTERNAL, start_time=started
            )
        span.set_attribute("mana_ai.round", round_no)
        return span

    def _compacted(self, event: Compacted) -> None:
        done = event.compaction
        span = self._compaction_span(event.round, done.duration_ms)
        span.set_attributes(
            {
                "mana_ai.compaction.folded_turns": done.folded_turns,
                "mana_ai.compaction.tokens_before": done.tokens_before,
                "mana_ai.compaction.tokens_after": done.tokens_after,
            }
        )
        if done.model:
            span.set_attribute("gen_ai.request.model", done.model)
        span.end()

    def _compaction_failed(self, event: CompactionFailed) -> None:
        error = event.error
        span = self._compaction_span(event.round, error.duration_ms)
        span.set_attributes(
            {"error.type": error.reason, "mana_ai.compaction.tokens_before": error.tokens_before}
        )
        described = self.tracing.clipped(str(error)) if self.capture_content else None
        span.set_status(Status(StatusCode.ERROR, described))
        span.end()

    def _tool_span(self, event: CallFinished) -> None:
        executed = event.executed
        call = executed.call
        position = (executed.round, executed.index)
        hint = self.hints.pop(position, None)
        offered = call.name in self.tools  # else a name the model invented: content
        tool = self._tool_name(call.name)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": bounded(call.id),
            "gen_ai.tool.type": "function",
            "mana_ai.round": executed.round,
            "mana_ai.tool.position": executed.index,
        }
        if hint is not None:
            attributes["mana_ai.tool.policy_hint"] = hint
        decision = executed.decision
        if decision is not None:
            if decision.verdict is not None:
                attributes["mana_ai.policy.verdict"] = decision.verdict
            if decision.reason is not None:
                attributes["mana_ai.policy.reason"] = decision.reason
            if decision.mode is not None:
                attributes["mana_ai.policy.mode"] = str(decision.mode)
            if decision.flags:
                attributes["mana_ai.policy.flags"] = decision.flags
            if decision.markers:
                attributes["mana_ai.policy.markers"] = decision.markers
        error_type = _tool_error_type(executed)
        if error_type is not None:
            attributes["error.type"] = error_type
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = content.tool_arguments(executed)
            attributes["gen_ai.tool.call.result"] = content.tool_result(executed)
        ended = time.time_ns()
        span = self.tracer.start_span(
            f"execute_tool {tool}" if offered else "execute_tool",
            context=self.context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=ended - int(executed.duration_ms * 1e6),
        )
        if error_type is not None:
            error = executed.error or ""
            described = self.tracing.clipped(error) if self.capture_content else None
            span.set_status(Status(StatusCode.ERROR, described))
        span.end(end_time=ended)

    def raised(self, exc: BaseException) -> None:
        """The run ended with ``exc`` (cancelled, interrupted, crashed)."""
        self.span.set_attribute("error.type", type(exc).__name__)
        described = self.tracing.clipped(str(exc)) if self.capture_content else None
        self.span.set_status(Status(StatusCode.ERROR, described))

    def end(self) -> None:
        """End the run's span (and a compaction span left open by an exception)."""
        if self.compaction is not None:
            self.compaction.end()
            self.compaction = None
        span = self.span
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": self.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": self.usage.completion_tokens,
            }
        )
        stopped = self.stopped
        if stopped is not None:
            span.set_attributes(
                {"mana_ai.rounds": stopped.rounds, "mana_ai.stop_reason": str(stopped.stop_reason)}
            )
            if stopped.stop_reason in FAILED_STOP_REASONS:
                span.set_attribute("error.type", str(stopped.stop_reason))
                error = stopped.error or ""
                span.set_status(
                    Status(
                        StatusCode.ERROR,
                        self.tracing.clipped(error) if self.capture_content else None,
                    )
                )
            elif self.capture_content and stopped.final_answer is not None:
                span.set_attribute(
                    "gen_ai.output.messages",
                    content.output_messages(
                        ChatMessage(role="assistant", content=stopped.final_answer), "stop"
                    ),
                )
        span.end()


def _tool_error_type(executed: ExecutedCall) -> str | None:
    """The ``error.type`` of a call that did not succeed (module docstring), else ``None``."""
    if executed.error is None:
        return None
    decision = executed.decision
    if decision is not None and not decision.allow:
        return "denied"
    if executed.outcome_unknown:
        return "outcome_unknown"
    if not executed.ran:
        return "not_run"
    return "tool_error"
