"""A ChatModel for any OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint.

Works with OpenAI, vLLM, Ollama (``/v1``), LiteLLM, OpenRouter, DeepSeek, Gemini's
compatibility layer, Azure, mana-llm and anything else that speaks the Chat Completions wire
format (https://platform.openai.com/docs/api-reference/chat/create). What each kind of reply
means is in ``worker.llm.openai_reply``; how the stored log is rewritten for the wire
is in ``worker.llm.openai_request``; tool schemas per dialect in
``worker.llm.tool_schema``.

Deadline: each attempt, from connecting to the last byte of the body, must finish within
``timeout_s`` (httpx's own timeouts apply per read, so a body that trickles in one byte at a
time would otherwise hold a mission indefinitely).

Retries (via ``tenacity``): a request is retried after HTTP 408, 429 and 5xx answers, after
the same statuses reported inside a 2xx body, after timeouts and after transport errors
(connect / read failures), with exponential backoff and full jitter: before retry *n*
(1-based) it sleeps ``uniform(0, min(backoff_max_s, backoff_initial_s * 2 ** (n - 1)))``
seconds. When the answer carries ``Retry-After`` (delta-seconds or an HTTP-date, RFC 9110
§10.2.3) that delay is used instead, capped at ``backoff_max_s``. Any other error fails at
once. Usage reported by failed attempts is added to the request's usage (it may be billed).

Transport failures: aiohttp's connection errors (refused, reset, the server hung up, a body
cut off) and timeouts, and httpx's own transport errors when an httpx transport is given
(tests), are connection failures, retried. An answer aiohttp's parser refuses (a header
over 8190 bytes, 100,000 headers) is an unusable answer, an ``LLMResponseError`` at once
(not retried: the endpoint would answer the same), and any other failure of the HTTP stack
is one too, named by its type (``worker.llm.openai_failures.unusable_answer``); so each
becomes an ``LLMError`` that the fallback endpoint and the iteration's error handle like any
other, never an exception of the HTTP stack.

Client: aiohttp's (``worker.llm.aiohttp_client``), not httpx's: at a model's latency of
1 s (give or take 0.5 s) and 50 to 100 requests in flight, httpx's and httpx2's pools cost CPU
per request that grows with the connections they hold, and their throughput fell more than
the 20 % issue 32 allows below aiohttp's (``bench/llm_client.py``; docs/performance.md, "LLM
HTTP client").

Size: the body is read as it arrives and held to ``max_response_bytes`` decoded bytes
(``worker.llm.response_body``: gzip and deflate are decoded with bounded output, a
``Content-Length`` above the cap refuses the answer before it is read). An answer that passes
the cap is stopped there (the connection is dropped, not drained) and fails at once as an
``LLMResponseError``: it is not retried, since another attempt would only pull as much again.
The body of a non-2xx answer is read only for an excerpt: its first ``ERROR_BODY_BYTES``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from planner.errors import LLMError, LLMResponseError
from planner.llm import CompletionRequest, CompletionResponse
from planner.messages import TokenUsage
from worker.llm.aiohttp_client import AiohttpAnswer, aiohttp_post, open_session
from worker.llm.openai_arguments import check_limits, completions_url, endpoint_url
from worker.llm.openai_failures import (
    Retryable,
    attempts_text,
    final_error,
    head,
    retry_after_s,
    retryable_status,
    shown_url,
    status_error,
    status_text,
    too_large,
    transport_cause,
    unusable_answer,
)
from worker.llm.openai_reply import ErrorReply, estimate_tokens, parse_chat_completion
from worker.llm.openai_request import (
    TOOLS_HERE,
    ToolDefinitions,
    encode_text,
    request_text,
    wire_messages,
)
from worker.llm.response_body import (
    ACCEPT_ENCODING,
    Answer,
    BodyNotDecodable,
    BodyTooLarge,
    read_body,
)
from worker.llm.tool_schema import SchemaDialect, adapt_schema

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "ERROR_BODY_BYTES",
    "OpenAICompatibleChatModel",
]

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""Decoded bytes of a chat completion answer held at most, by default (8 MiB): a thousand
times a long answer with tool calls, and a bound on what one request can cost in memory."""

ERROR_BODY_BYTES = 64 * 1024
"""Bytes of a non-2xx answer's body read at most (its error text is quoted from them)."""


class OpenAICompatibleChatModel:
    """A ChatModel over HTTP for an OpenAI-compatible Chat Completions endpoint.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``http://localhost:8000/v1``;
            requests go to ``{base_url}/chat/completions``. Must be ``http`` or ``https``
            with a host; ``ValueError`` otherwise (also for what httpx cannot parse: a bad
            port, a control character).
        api_key: sent as ``Authorization: Bearer <api_key>`` when set; no header when ``None``.
        default_model: model name used when ``CompletionRequest.model`` is ``None``. When both are
            ``None`` the ``model`` field is left out of the request body: endpoints that serve a
            single model (vLLM, llama.cpp server) then use it, endpoints that require the field
            (OpenAI, Ollama, LiteLLM) answer 400, which surfaces as ``LLMStatusError``.
        timeout_s: deadline in seconds for one attempt, from connecting to the last byte of the
            answer (default 60).
        max_retries: retries after the first attempt (default 3, so 4 attempts at most).
        backoff_initial_s: upper bound of the first jittered backoff, in seconds (default 0.5).
        backoff_max_s: cap on any single wait, ``Retry-After`` included, in seconds (default 30).
        sleep: ``async (seconds) -> None`` used between attempts (default ``asyncio.sleep``);
            tests inject a recorder.
        transport: an httpx transport (e.g. ``httpx.MockTransport``) instead of the network
            (requests then go through httpx's client; without one, through aiohttp's).
        on_retry: called as ``on_retry(attempt, reason)`` before each retry, where ``attempt`` is
            the 1-based number of the attempt that just failed and ``reason`` is ``http_<status>``
            (for an error inside a 2xx body too), ``timeout`` or ``connection`` (a small, fixed
            set, fit for a metrics label).
        name: this endpoint's name, recorded on every response (``CompletionResponse.endpoint``)
            and used to send provider fields back only to the endpoint that produced them.
        schema_dialect: how tool parameter schemas are sent (``json-schema`` or ``gemini``; see
            ``worker.llm.tool_schema``).
        strip_schema_keywords: JSON Schema keywords left out of the tool schemas sent.
        max_connections: HTTP connections to the endpoint open at once, at most (default 100,
            httpx's); a request finding all busy waits for one. Size it to the requests in
            flight (the worker passes ``MANA_AI_MAX_CONCURRENT_MISSIONS``).
        max_response_bytes: decoded bytes of an answer's body held at most (default
            ``DEFAULT_MAX_RESPONSE_BYTES``, 8 MiB; >= 1); see the module docstring.
        max_response_bytes_name: what the error of a larger answer calls that limit (default
            ``max_response_bytes``; the worker passes the setting an operator would raise).

    Raises (from ``complete``), each carrying in ``usage`` what failed attempts reported:
        LLMStatusError: a non-2xx answer, or an error inside a 2xx body (after retries for
            408 / 429 / 5xx); ``status_code`` is the status the error stands for.
        LLMConnectionError: no whole answer (connect error, deadline) after all retries.
        LLMResponseError: a 2xx answer that is not a usable chat completion, a body
            larger than ``max_response_bytes``, or an answer the HTTP client cannot parse
            (a header over 8190 bytes, too many headers; see ``unusable_answer``): at once,
            not retried.

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
        name: str | None = None,
        schema_dialect: SchemaDialect = "json-schema",
        strip_schema_keywords: Collection[str] = (),
        max_connections: int = 100,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_response_bytes_name: str = "max_response_bytes",
    ) -> None:
        url = endpoint_url(base_url)
        check_limits(
            max_retries,
            timeout_s,
            backoff_initial_s,
            backoff_max_s,
            max_response_bytes,
            max_connections,
        )
        self.max_response_bytes = max_response_bytes
        self.max_response_bytes_name = max_response_bytes_name
        self.base_url = base_url.rstrip("/")
        self.url = completions_url(url)
        self.shown_url = shown_url(self.url)
        self._url, basic = _split_credentials(httpx.URL(self.url))
        self.default_model = default_model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.name = name
        self.schema_dialect: SchemaDialect = schema_dialect
        self.strip_schema_keywords = frozenset(strip_schema_keywords)
        adapt_schema({}, dialect=schema_dialect)  # raises ValueError for an unknown dialect
        self._sleep = sleep
        self._on_retry = on_retry
        self._jitter = wait_random_exponential(multiplier=backoff_initial_s, max=backoff_max_s)
        # what an error's text must never show (an exception's message may quote them)
        self._secrets = [v for v in (api_key, url.password, url.query.decode()) if v]
        self._tool_texts = ToolDefinitions()  # the tool definitions encoded for this endpoint
        headers = _headers(api_key)
        self._client = None if transport is None else _test_client(headers, basic, transport)
        self._session: aiohttp.ClientSession | None = None  # made at the first request
        self._aio = aiohttp_post(
            self._url,
            {**headers, **_JSON_CONTENT},
            basic=basic,
            timeout_s=timeout_s,
            max_connections=max_connections,
        )

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Send one chat completion request, retrying as described in the module docstring.

        Raises:
            LLMStatusError, LLMConnectionError, LLMResponseError: see the class docstring.
        """
        payload, text = self._payload(request)
        # the whole body (messages, tools and a few small fields), not serialised twice
        tally = _Tally(prompt_estimate=estimate_tokens(text))
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(Retryable),
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            reply: CompletionResponse = await retrying(self._attempt, payload, tally)
        except Retryable as exc:
            error = final_error(exc, self.shown_url, self.timeout_s, tally.attempts)
            error.usage = tally.billed
            raise error from exc.exc
        except LLMError as exc:
            exc.usage = tally.billed
            raise
        return reply.model_copy(update={"usage": reply.usage + tally.billed, "endpoint": self.name})

    async def _attempt(self, payload: bytes, tally: _Tally) -> CompletionResponse:
        """One attempt: post ``payload`` within the deadline and judge the answer.

        Raises:
            Retryable: a failure worth another attempt (status, timeout, connection).
            LLMError: a failure another attempt would not mend.
        """
        tally.attempts += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                response, content = await self._post(payload)
        except BodyTooLarge as exc:
            raise too_large(
                exc, self.shown_url, self.max_response_bytes_name, tally.attempts
            ) from None
        except BodyNotDecodable as exc:
            raise LLMResponseError(
                f"LLM endpoint {self.shown_url} sent a body that could not be decoded: {exc}"
            ) from None
        except Exception as exc:  # what the HTTP stack raises (module docstring)
            raise self._failed(exc, tally.attempts) from exc
        if retryable_status(response.status_code):
            raise Retryable(
                f"http_{response.status_code}",
                status=response.status_code,
                answered=status_text(response),
                body=head(response, content),
                retry_after_s=retry_after_s(response.headers.get("Retry-After")),
            )
        if not response.is_success:
            raise status_error(
                self.shown_url,
                response.status_code,
                status_text(response),
                head(response, content),
                tally.attempts,
            )
        return self._parsed(response, content, tally)

    def _parsed(self, response: Answer, content: bytes, tally: _Tally) -> CompletionResponse:
        """The chat completion in a 2xx answer; an error inside it raised as its status would
        be (``Retryable`` or ``LLMStatusError``), the usage it reports added to ``tally``."""
        try:
            return parse_chat_completion(
                response, content, url=self.shown_url, prompt_tokens_estimate=tally.prompt_estimate
            )
        except ErrorReply as exc:
            tally.billed = tally.billed + exc.usage
            answered = f"{response.status_code} with an error ({exc.status})"
            if retryable_status(exc.status):
                raise Retryable(
                    f"http_{exc.status}", status=exc.status, answered=answered, body=exc.message
                ) from None
            raise status_error(
                self.shown_url, exc.status, answered, exc.message, tally.attempts
            ) from None
        except LLMResponseError as exc:
            tally.billed = tally.billed + exc.usage
            raise

    def request_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so callers can log or inspect it).

        Messages are rewritten for the wire by ``wire_messages``; tool parameter schemas are
        adapted to ``schema_dialect`` minus ``strip_schema_keywords``. ``tool_choice`` is sent
        only with tools and when not ``auto``; ``temperature`` and ``max_tokens`` only when set.
        """
        return self._body(request, [self._wire_tool(tool) for tool in request.tools])

    def _body(self, request: CompletionRequest, tools: Any) -> dict[str, Any]:
        """``request_body`` with ``tools`` as the value of ``"tools"`` (when there are any)."""
        names = [str(t.get("function", {}).get("name", "")) for t in request.tools]
        body: dict[str, Any] = {
            "messages": wire_messages(request.messages, endpoint=self.name, tool_names=names)
        }
        model = request.model or self.default_model
        if model is not None:
            body["model"] = model
        if request.tools:
            body["tools"] = tools
            if request.tool_choice != "auto":
                body["tool_choice"] = request.tool_choice
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        return body

    def _payload(self, request: CompletionRequest) -> tuple[bytes, str]:
        """``encode_body(self.request_body(request))`` (the same bytes) and its text, each
        ``ToolSpec``'s definition encoded once per endpoint (``ToolDefinitions``)."""
        basis = (self.schema_dialect, self.strip_schema_keywords)
        text = request_text(
            self._body(request, TOOLS_HERE),
            lambda: self._tool_texts.text(request.tools, basis, self._wire_tool),
        )
        return encode_text(text), text

    def _wire_tool(self, tool: dict[str, Any]) -> dict[str, Any]:
        function = tool.get("function")
        if not isinstance(function, dict) or "parameters" not in function:
            return tool
        if self.schema_dialect == "json-schema" and not self.strip_schema_keywords:
            return tool
        parameters = adapt_schema(
            function["parameters"],
            dialect=self.schema_dialect,
            strip=self.strip_schema_keywords,
        )
        return {**tool, "function": {**function, "parameters": parameters}}

    async def _post(self, payload: bytes) -> tuple[Answer, bytes]:
        """Send ``payload``; the answer and its body, read within the caps (module docstring).

        Raises:
            BodyTooLarge, BodyNotDecodable: a 2xx body, see ``read_body``; the connection is
                dropped. (A non-2xx body that does not decode is taken as empty.)
            aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError,
                httpx.TransportError: connecting, sending or reading failed.
            Exception: what else the HTTP stack raised (``unusable_answer`` judges it).
        """
        response: Answer
        if self._client is None:
            session = self._session or self._new_session()
            response = AiohttpAnswer(
                await session.post(
                    self._aio.url,
                    data=payload,
                    headers=self._aio.headers,
                    proxy=self._aio.proxy,
                    allow_redirects=False,
                    timeout=self._aio.timeout,
                )
            )
        else:
            # an httpx.URL, parsed once: a str would be parsed and quoted again per request
            request = self._client.build_request(
                "POST", self._url, content=payload, headers=_JSON_CONTENT
            )
            response = await self._client.send(request, stream=True)
        try:
            if response.is_success:
                content = await read_body(response, limit_bytes=self.max_response_bytes)
            else:  # read for its text only: the status decides what happens next
                limit = min(ERROR_BODY_BYTES, self.max_response_bytes)
                try:
                    content = await read_body(response, limit_bytes=limit, truncate=True)
                except BodyNotDecodable:
                    content = b""
        finally:
            await response.aclose()
        return response, content

    def _new_session(self) -> aiohttp.ClientSession:
        """aiohttp's session, made in the running loop at the first request."""
        self._session = open_session(self._aio.max_connections)
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool. The model must not be used afterwards."""
        if self._client is not None:
            await self._client.aclose()
        if self._session is not None:
            await self._session.close()

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
        if isinstance(exc, Retryable) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, self.backoff_max_s)
        return float(self._jitter(state))

    def _before_sleep(self, state: RetryCallState) -> None:
        if self._on_retry is None:
            return
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = exc.reason if isinstance(exc, Retryable) else "unknown"
        self._on_retry(state.attempt_number, reason)

    def _failed(self, exc: Exception, attempts: int) -> Exception:
        """What an attempt that failed with ``exc`` raises: ``Retryable`` (a timeout, a
        connection failure), else the ``LLMResponseError`` of an unusable answer, secrets
        masked."""
        if isinstance(exc, TimeoutError | httpx.TransportError | aiohttp.ClientPayloadError):
            cause = transport_cause(exc)
            timed_out = isinstance(cause, TimeoutError) or (
                cause is exc and isinstance(exc, httpx.TimeoutException)
            )
            return Retryable("timeout" if timed_out else "connection", exc=cause)
        what = unusable_answer(exc)
        if what is None:
            return Retryable("connection", exc=exc)
        for secret in self._secrets:
            what = what.replace(secret, "***")
        return LLMResponseError(
            f"LLM endpoint {self.shown_url} {what} ({attempts_text(attempts)}; not retried)"
        )


_JSON_CONTENT = {"Content-Type": "application/json"}


@dataclass
class _Tally:
    """What the attempts of one request counted: how many ran, the usage failed ones
    reported (it may be billed), and the prompt's estimated tokens."""

    prompt_estimate: int
    attempts: int = 0
    billed: TokenUsage = field(default_factory=TokenUsage)


def _test_client(
    headers: dict[str, str], basic: tuple[str, str] | None, transport: httpx.AsyncBaseTransport
) -> httpx.AsyncClient:
    """httpx's client over ``transport`` (a test's ``MockTransport``), sending what the
    aiohttp path sends."""
    auth = httpx.BasicAuth(*basic) if basic is not None else None
    return httpx.AsyncClient(headers=headers, transport=transport, auth=auth)


def _headers(api_key: str | None) -> dict[str, str]:
    """Every request's headers: JSON accepted, only the codings ``read_body`` decodes with
    bounded output (httpx adds br when brotli is installed, whose decoder it cannot bound),
    and ``Bearer api_key`` when there is a key."""
    headers = {"Accept": "application/json", "Accept-Encoding": ACCEPT_ENCODING}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _split_credentials(url: httpx.URL) -> tuple[httpx.URL, tuple[str, str] | None]:
    """``url`` without its credentials, and them: they go as Basic auth, not in the URL sent
    (aiohttp refuses both)."""
    basic = (url.username, url.password) if url.userinfo else None
    return url.copy_with(userinfo=b""), basic
