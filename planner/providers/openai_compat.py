"""A ChatModel for any OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint.

Works with OpenAI, vLLM, Ollama (``/v1``), LiteLLM, mana-llm and anything else that speaks the
Chat Completions wire format. Message, tool and response shapes follow the OpenAI Chat
Completions API reference (https://platform.openai.com/docs/api-reference/chat/create).

Retries (via ``tenacity``): a request is retried after HTTP 408, 429 and 5xx answers, after
timeouts and after transport errors (connect / read failures), with exponential backoff and
full jitter: before retry *n* (1-based) it sleeps ``uniform(0, min(backoff_max_s,
backoff_initial_s * 2 ** (n - 1)))`` seconds. When the answer carries ``Retry-After``
(delta-seconds or an HTTP-date, RFC 9110 §10.2.3) that delay is used instead, capped at
``backoff_max_s``. Any other non-2xx answer fails at once.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from planner.errors import LLMConnectionError, LLMError, LLMResponseError, LLMStatusError
from planner.llm import CompletionRequest, CompletionResponse
from planner.messages import ChatMessage, TokenUsage, ToolCall

__all__ = ["OpenAICompatibleChatModel"]

_EXCERPT_CHARS = 500
"""Longest body excerpt put into an error message."""

_RETRYABLE_STATUS = frozenset({408, 429})
"""Non-5xx statuses worth retrying: Request Timeout and Too Many Requests (RFC 9110, RFC 6585)."""


class OpenAICompatibleChatModel:
    """A ChatModel over HTTP for an OpenAI-compatible Chat Completions endpoint.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``http://localhost:8000/v1``;
            requests go to ``{base_url}/chat/completions``. Must be ``http`` or ``https``.
        api_key: sent as ``Authorization: Bearer <api_key>`` when set; no header when ``None``.
        default_model: model name used when ``CompletionRequest.model`` is ``None``. When both are
            ``None`` the ``model`` field is left out of the request body: endpoints that serve a
            single model (vLLM, llama.cpp server) then use it, endpoints that require the field
            (OpenAI, Ollama, LiteLLM) answer 400, which surfaces as ``LLMStatusError``.
        timeout_s: per-attempt timeout in seconds for connect, read, write and pool (default 60).
        max_retries: retries after the first attempt (default 3, so 4 attempts at most).
        backoff_initial_s: upper bound of the first jittered backoff, in seconds (default 0.5).
        backoff_max_s: cap on any single wait, ``Retry-After`` included, in seconds (default 30).
        sleep: ``async (seconds) -> None`` used between attempts (default ``asyncio.sleep``);
            tests inject a recorder.
        transport: an httpx transport (e.g. ``httpx.MockTransport``) instead of the network.
        on_retry: called as ``on_retry(attempt, reason)`` before each retry, where ``attempt`` is
            the 1-based number of the attempt that just failed and ``reason`` is ``http_<status>``,
            ``timeout`` or ``connection`` (a small, fixed set, fit for a metrics label).

    Raises (from ``complete``):
        LLMStatusError: a non-2xx answer (after retries for 408 / 429 / 5xx).
        LLMConnectionError: no answer (connect error, timeout) after all retries.
        LLMResponseError: a 2xx answer that is not a usable chat completion.

    Use ``async with`` or call ``aclose()`` to release the connection pool.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        default_model: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        transport: httpx.AsyncBaseTransport | None = None,
        on_retry: Callable[[int, str], None] | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0 or backoff_initial_s < 0 or backoff_max_s < 0:
            raise ValueError(
                "timeout_s must be > 0 and backoff_initial_s, backoff_max_s >= 0; got "
                f"{timeout_s}, {backoff_initial_s}, {backoff_max_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.default_model = default_model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._sleep = sleep
        self._on_retry = on_retry
        self._jitter = wait_random_exponential(multiplier=backoff_initial_s, max=backoff_max_s)
        headers = {"Accept": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout_s), transport=transport
        )

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Send one chat completion request, retrying as described in the module docstring.

        Raises:
            LLMStatusError, LLMConnectionError, LLMResponseError: see the class docstring.
        """
        body = self.request_body(request)
        attempts = 0

        async def attempt() -> httpx.Response:
            nonlocal attempts
            attempts += 1
            try:
                response = await self._client.post(self.url, json=body)
            except httpx.TimeoutException as exc:
                raise _Retryable("timeout", exc=exc) from exc
            except httpx.TransportError as exc:
                raise _Retryable("connection", exc=exc) from exc
            except httpx.DecodingError as exc:
                raise LLMResponseError(
                    f"LLM endpoint {self.url} sent a body that could not be decoded: {exc}"
                ) from exc
            if response.status_code >= 500 or response.status_code in _RETRYABLE_STATUS:
                raise _Retryable(
                    f"http_{response.status_code}",
                    response=response,
                    retry_after_s=_retry_after_s(response.headers.get("Retry-After")),
                )
            return response

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(_Retryable),
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            response: httpx.Response = await retrying(attempt)
        except _Retryable as exc:
            raise self._final_error(exc, attempts) from exc.exc
        if not response.is_success:
            raise _status_error(self.url, response, attempts)
        return parse_chat_completion(response, url=self.url)

    def request_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so callers can log or inspect it).

        ``tool_choice`` is sent only with tools and when not ``auto``; ``temperature`` and
        ``max_tokens`` only when set.
        """
        body: dict[str, Any] = {"messages": [to_openai_message(m) for m in request.messages]}
        model = request.model or self.default_model
        if model is not None:
            body["model"] = model
        if request.tools:
            body["tools"] = request.tools
            if request.tool_choice != "auto":
                body["tool_choice"] = request.tool_choice
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        return body

    async def aclose(self) -> None:
        """Close the connection pool. The model must not be used afterwards."""
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _wait(self, state: RetryCallState) -> float:
        """Seconds to sleep before the next attempt: Retry-After if given, else full jitter."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _Retryable) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, self.backoff_max_s)
        return float(self._jitter(state))

    def _before_sleep(self, state: RetryCallState) -> None:
        if self._on_retry is None:
            return
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = exc.reason if isinstance(exc, _Retryable) else "unknown"
        self._on_retry(state.attempt_number, reason)

    def _final_error(self, exc: _Retryable, attempts: int) -> LLMError:
        if exc.response is not None:
            return _status_error(self.url, exc.response, attempts)
        cause = exc.exc
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        if exc.reason == "timeout":
            return LLMConnectionError(
                f"LLM endpoint {self.url} did not answer within {self.timeout_s:g} s "
                f"({_attempts(attempts)}): {detail}"
            )
        return LLMConnectionError(
            f"could not reach LLM endpoint {self.url} ({_attempts(attempts)}): {detail}"
        )


class _Retryable(Exception):
    """An attempt failed in a way worth retrying; carries what the final error needs."""

    def __init__(
        self,
        reason: str,
        *,
        response: httpx.Response | None = None,
        exc: BaseException | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response
        self.exc = exc
        self.retry_after_s = retry_after_s


def _attempts(n: int) -> str:
    return f"after {n} attempt{'s' if n != 1 else ''}"


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"


def _status_error(url: str, response: httpx.Response, attempts: int) -> LLMStatusError:
    body = response.text[:_EXCERPT_CHARS]
    status = f"{response.status_code} {response.reason_phrase}".strip()
    excerpt = _excerpt(body) or "(empty body)"
    return LLMStatusError(
        f"LLM endpoint {url} answered {status} {_attempts(attempts)}: {excerpt}",
        status_code=response.status_code,
        body=body,
    )


def _retry_after_s(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (RFC 9110 §10.2.3), or ``None``.

    Accepts delta-seconds (``"7"``, fractional values tolerated) or an HTTP-date (a date in the
    past means 0). Anything unparseable is ignored (``None``: fall back to jittered backoff).
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # RFC 9110 HTTP-dates are always GMT
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def to_openai_message(message: ChatMessage) -> dict[str, Any]:
    """One ChatMessage in the OpenAI Chat Completions request format.

    Assistant tool calls become ``{"id", "type": "function", "function": {"name",
    "arguments": <JSON string>}}``; tool messages carry ``tool_call_id``.
    """
    out: dict[str, Any] = {"role": message.role}
    if message.role == "assistant" and message.tool_calls:
        out["content"] = message.content
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                },
            }
            for call in message.tool_calls
        ]
    else:
        out["content"] = message.content or ""
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id or ""
    return out


def parse_chat_completion(response: httpx.Response, *, url: str) -> CompletionResponse:
    """Turn a 2xx chat completion answer into a CompletionResponse.

    Reads ``choices[0].message`` (``content``, ``tool_calls``), ``choices[0].finish_reason`` and
    ``usage`` (missing usage counts as zero tokens). Tool-call arguments that are not a JSON
    object give ``ToolCall.parse_error`` and empty arguments rather than an exception; a tool
    call without an id gets a generated ``call_<hex>`` id.

    Raises:
        LLMResponseError: the body is not JSON, has no choices, or has the wrong shapes; the
            message says what was wrong and quotes up to 500 characters of the body.
    """

    def bad(what: str) -> LLMResponseError:
        return LLMResponseError(
            f"LLM endpoint {url} answered {response.status_code} with {what}: "
            f"{_excerpt(response.text) or '(empty body)'}"
        )

    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad("a body that is not JSON") from None
    if not isinstance(data, dict):
        raise bad("JSON that is not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise bad("no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise bad("a first choice without a message object")
    message = choice["message"]

    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    if content is not None and not isinstance(content, str):
        raise bad("a message content that is neither a string nor null")

    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise bad("tool_calls that is not a list")
    calls: list[ToolCall] = []
    for raw in raw_calls:
        function = raw.get("function") if isinstance(raw, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise bad("a tool call without a function name")
        call_id = raw.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{uuid.uuid4().hex[:24]}"
        arguments, parse_error = _parse_arguments(function.get("arguments"))
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments, parse_error=parse_error))

    finish_reason = choice.get("finish_reason")
    return CompletionResponse(
        message=ChatMessage(role="assistant", content=content, tool_calls=tuple(calls)),
        usage=_parse_usage(data.get("usage")),
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
    )


def _parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """(arguments, parse_error) from a tool call's ``arguments`` (a JSON string per the API).

    An already-decoded object is accepted (some compatible servers send one); an empty string
    or null means no arguments.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return {}, f"arguments must be a JSON string, got {type(raw).__name__}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"arguments are not valid JSON: {exc.msg} at position {exc.pos}"
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def _parse_usage(raw: Any) -> TokenUsage:
    if not isinstance(raw, dict):
        return TokenUsage()

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and value >= 0 else 0

    return TokenUsage(
        prompt_tokens=count("prompt_tokens"), completion_tokens=count("completion_tokens")
    )
