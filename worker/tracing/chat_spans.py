"""``TracedChatModel``: a ``chat {model}`` span and the ``gen_ai.client.*`` metrics per request.

It wraps the ChatModel a run uses (the worker's ``InstrumentedChatModel``, so retries and the
fallback happen inside the span). The span (kind ``CLIENT``) is a child of the span current
when the request starts: the run's ``invoke_agent``, or, for the summariser
(``summariser=True``), the run's ``compaction`` span, which this opens
(``RunSpans.open_compaction``). It carries:

* at the start: ``gen_ai.operation.name=chat``, the provider, ``gen_ai.request.model``
  (the request's, else the default model), ``gen_ai.request.max_tokens`` /
  ``.temperature`` when set, ``server.address`` / ``server.port`` of the primary endpoint,
  and for a mission's request its round (``mana_ai.round``) and the producers of the
  reminders it carried (``mana_ai.reminders``);
* at the end: ``gen_ai.response.finish_reasons``, ``gen_ai.response.model`` and ``.id``
  (what the answer says: the endpoint chose them, so each is cut to 128 characters and its
  hidden characters escaped, ``worker.tracing.chosen.bounded``),
  ``gen_ai.usage.input_tokens`` / ``.output_tokens`` (failed attempts included, as billed),
  the endpoint that answered (``mana_ai.llm.endpoint``: ``primary``, ``fallback``,
  ``compaction``; ``server.*`` become the fallback's when it answered);
* events ``mana_ai.llm.retry`` (attempt, ``error.type`` = ``http_<status>``, ``timeout``,
  ``connection``) and ``mana_ai.llm.fallback`` (the primary's error class), from the
  providers' hooks (``worker.tracing.hooks``);
* on failure an ``ERROR`` status and ``error.type``: the HTTP status the endpoint answered
  (``429``, ``500``, ...) or the error's class (``LLMConnectionError``, ``LLMResponseError``,
  ``CancelledError``);
* with ``MANA_AI_OTEL_CAPTURE_CONTENT``: ``gen_ai.input.messages`` (reminders included, as
  sent) and ``gen_ai.output.messages``.

``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage`` are recorded with the
operation, provider, request model, server address and port (and ``error.type`` /
``gen_ai.token.type``): never the response model, which an endpoint may spell any way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from planner import ChatModel, CompletionRequest, CompletionResponse, LLMError
from planner.errors import LLMStatusError
from worker.tracing import content
from worker.tracing.chosen import bounded
from worker.tracing.hooks import CURRENT_CHAT_SPAN
from worker.tracing.run_spans import CURRENT_RUN
from worker.tracing.setup import Tracing

__all__ = ["TracedChatModel"]

Endpoint = tuple[str, int]
"""``(server.address, server.port)`` of an endpoint."""


class TracedChatModel:
    """A ChatModel that traces every request to ``inner`` (see the module docstring).

    Args:
        inner: the model that answers.
        tracing: the app's tracer and instruments.
        provider: the ``gen_ai.system`` / ``gen_ai.provider.name`` value (``openai`` for an
            OpenAI-compatible endpoint, ``_OTHER`` for the embedded model).
        endpoints: ``(address, port)`` by endpoint name (``primary``, ``fallback``,
            ``compaction``); the first is the one asked first.
        default_model: the model an unnamed request goes to (``MANA_AI_LLM_MODEL``).
        summariser: this model writes compaction summaries (its spans go under the run's
            ``compaction`` span).
    """

    def __init__(
        self,
        inner: ChatModel,
        tracing: Tracing,
        *,
        provider: str,
        endpoints: Mapping[str, Endpoint] | None = None,
        default_model: str | None = None,
        summariser: bool = False,
    ) -> None:
        self.inner = inner
        self.tracer = tracing.tracer
        self.duration = tracing.operation_duration
        self.token_usage = tracing.token_usage
        self.capture_content = tracing.capture_content
        self.clipped = tracing.clipped
        self.provider_attribute = tracing.conventions.provider_attribute
        self.provider = provider
        self.endpoints = dict(endpoints or {})
        self.first_endpoint = next(iter(self.endpoints.values()), None)
        self.default_model = default_model
        self.summariser = summariser

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Delegate to ``inner`` inside a ``chat`` span. Re-raises what ``inner`` raises."""
        model = request.model or self.default_model
        common: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            self.provider_attribute: self.provider,
        }
        if model:
            common["gen_ai.request.model"] = model
        if self.first_endpoint is not None:
            common["server.address"], common["server.port"] = self.first_endpoint
        attributes, parent = self._request_attributes(request, common)
        span = self.tracer.start_span(
            f"chat {model}" if model else "chat",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        events = CURRENT_CHAT_SPAN.set(span.add_event)
        started = time.perf_counter()
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                response = await self.inner.complete(request)
        except BaseException as exc:
            self._failed(span, common, exc, time.perf_counter() - started)
            raise
        finally:
            CURRENT_CHAT_SPAN.reset(events)
        elapsed_s = time.perf_counter() - started
        span.set_attributes(self._answer_attributes(response, common))
        usage = response.usage
        self._usage(span, common, usage.prompt_tokens, usage.completion_tokens)
        span.end()
        if self.duration is not None:
            self.duration.record(elapsed_s, common)
        return response

    def _request_attributes(
        self, request: CompletionRequest, common: dict[str, Any]
    ) -> tuple[dict[str, Any], Any]:
        """The span's attributes at its start, and its parent (a compaction's span for the
        summariser, else the current context)."""
        attributes = dict(common)
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if request.temperature is not None:
            attributes["gen_ai.request.temperature"] = request.temperature
        parent = None
        run = CURRENT_RUN.get()
        if run is not None:
            if self.summariser:
                parent = run.open_compaction()
            elif (sent := run.take_request()) is not None:
                attributes["mana_ai.round"] = sent.round
                if sent.reminders:
                    attributes["mana_ai.reminders"] = tuple(r.producer for r in sent.reminders)
        if self.capture_content:
            attributes["gen_ai.input.messages"] = content.input_messages(request.messages)
        return attributes, parent

    def _failed(
        self, span: Any, common: dict[str, Any], exc: BaseException, elapsed_s: float
    ) -> None:
        """End ``span`` as an error, with the failed attempts' usage and the duration."""
        error_type = _error_type(exc)
        if isinstance(exc, LLMError):
            self._usage(span, common, exc.usage.prompt_tokens, exc.usage.completion_tokens)
        span.set_attribute("error.type", error_type)
        described = self.clipped(str(exc)) if self.capture_content else None
        span.set_status(Status(StatusCode.ERROR, described))
        span.end()
        if self.duration is not None:
            self.duration.record(elapsed_s, {**common, "error.type": error_type})

    def _answer_attributes(
        self, response: CompletionResponse, common: dict[str, Any]
    ) -> dict[str, Any]:
        """What the answer adds to the span (``common`` learns the endpoint that served it)."""
        answered: dict[str, Any] = {}
        if response.endpoint is not None:
            answered["mana_ai.llm.endpoint"] = response.endpoint
            served_by = self.endpoints.get(response.endpoint)
            if served_by is not None and served_by != self.first_endpoint:
                common["server.address"], common["server.port"] = served_by
                answered["server.address"], answered["server.port"] = served_by
        if response.finish_reason is not None:
            answered["gen_ai.response.finish_reasons"] = (bounded(response.finish_reason),)
        if response.response_model is not None:
            answered["gen_ai.response.model"] = bounded(response.response_model)
        if response.response_id is not None:
            answered["gen_ai.response.id"] = bounded(response.response_id)
        if self.capture_content:
            answered["gen_ai.output.messages"] = content.output_messages(
                response.message, response.finish_reason
            )
        return answered

    def _usage(self, span: Any, common: dict[str, Any], prompt: int, completion: int) -> None:
        """Tokens on the span and in ``gen_ai.client.token.usage``."""
        span.set_attributes(
            {"gen_ai.usage.input_tokens": prompt, "gen_ai.usage.output_tokens": completion}
        )
        if self.token_usage is not None:
            self.token_usage.record(prompt, {**common, "gen_ai.token.type": "input"})
            self.token_usage.record(completion, {**common, "gen_ai.token.type": "output"})


def _error_type(exc: BaseException) -> str:
    """``error.type`` of a failed request: the HTTP status an endpoint answered, else the
    error's class."""
    if isinstance(exc, LLMStatusError) and exc.status_code:
        return str(exc.status_code)
    return type(exc).__name__
