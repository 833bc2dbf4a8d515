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
is one too, named by its type (``unusable_answer``); so each becomes an ``LLMError`` that
the fallback endpoint and the iteration's error handle like any other, never an exception of
the HTTP stack.

Size: the body is read as it arrives and held to ``max_response_bytes`` decoded bytes
(``worker.llm.response_body``: gzip and deflate are decoded with bounded output, a
``Content-Length`` above the cap refuses the answer before it is read). An answer that passes
the cap is stopped there (the connection is dropped, not drained) and fails at once as an
``LLMResponseError``: it is not retried, since another attempt would only pull as much again.
The body of a non-2xx answer is read only for an excerpt: its first ``ERROR_BODY_BYTES``.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import email.utils
import math
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from datetime import UTC, datetime
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

from planner.errors import LLMConnectionError, LLMError, LLMResponseError, LLMStatusError
from planner.llm import CompletionRequest, CompletionResponse
from planner.messages import TokenUsage
from worker.llm.openai_reply import (
    EXCERPT_CHARS,
    ErrorReply,
    body_text,
    estimate_tokens,
    excerpt,
    parse_chat_completion,
)
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
    "unusable_answer",
]

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""Decoded bytes of a chat completion answer held at most, by default (8 MiB): a thousand
times a long answer with tool calls, and a bound on what one request can cost in memory."""

ERROR_BODY_BYTES = 64 * 1024
"""Bytes of a non-2xx answer's body read at most (its error text is quoted from them)."""

_RETRYABLE_STATUS = frozenset({408, 429})
"""Non-5xx statuses worth retrying: Request Timeout and Too Many Requests (RFC 9110, RFC 6585)."""


AIOHTTP_TRANSPORT = "aiohttp.ClientSession"
"""Requests to an endpoint go straight through aiohttp's client and its connection pool (one
``ClientSession`` per model, made at the first request). httpcore's own pool cost about 1.7
ms of CPU per request on the 2-core CI machine and scans every connection for every request
it assigns (encode/httpcore#1035); aiohttp's about 0.45 ms, whatever the number of
connections. httpx's API on top of aiohttp's pool (``httpx-aiohttp``, as before) cost both:
its request, header and response objects were a third of the request path's CPU
(bench/concurrency.py). httpx stays for what it is given as ``transport`` (tests'
``MockTransport``)."""


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
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL as exc:  # a ValueError-like refusal, as for any bad argument
            raise ValueError(f"base_url is not a usable URL ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(
                f"base_url must be an http(s) URL with a host, got {shown_url(base_url)!r}"
            )
        if url.port is not None and not 1 <= url.port <= 65535:
            raise ValueError(f"base_url has an invalid port ({url.port}); a port is 1 to 65535")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0 or backoff_initial_s < 0 or backoff_max_s < 0:
            raise ValueError(
                "timeout_s must be > 0 and backoff_initial_s, backoff_max_s >= 0; got "
                f"{timeout_s}, {backoff_initial_s}, {backoff_max_s}"
            )
        if max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
        self.max_response_bytes = max_response_bytes
        self.max_response_bytes_name = max_response_bytes_name
        self.base_url = base_url.rstrip("/")
        # the path goes before a query (``…/v1?key=…`` → ``…/v1/chat/completions?key=…``)
        self.url = str(url.copy_with(path=url.path.rstrip("/") + "/chat/completions"))
        self.shown_url = shown_url(self.url)
        # credentials in the URL go as Basic auth, not in the URL sent (aiohttp refuses both)
        self._url = httpx.URL(self.url)
        auth = None
        self._url_user, self._url_password = self._url.username, self._url.password
        if self._url.userinfo:
            auth = httpx.BasicAuth(self._url.username, self._url.password)
            self._url = self._url.copy_with(userinfo=b"")
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
        # only the codings read_body decodes with bounded output (httpx adds br when brotli
        # is installed, whose decoder it cannot bound)
        headers = {"Accept": "application/json", "Accept-Encoding": ACCEPT_ENCODING}
        # what an error's text must never show (an exception's message may quote them)
        self._secrets = [v for v in (api_key, url.password, url.query.decode()) if v]
        # the tool definitions encoded for this endpoint
        self._tool_texts = ToolDefinitions()
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        # every connection may stay open: the next rounds' requests reuse them
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        timeout = httpx.Timeout(timeout_s)
        self._client: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None
        if transport is not None:
            self._client = httpx.AsyncClient(
                headers=headers, timeout=timeout, limits=limits, transport=transport, auth=auth
            )
        # aiohttp's client (AIOHTTP_TRANSPORT), its session made at the first request (in
        # the event loop that uses it); what httpx's client did by default, set once here
        self._max_connections = max_connections
        self._aio_url = str(self._url)
        self._aio_headers = {**headers, **_JSON_CONTENT}
        if auth is not None:  # as httpx.BasicAuth sends it (over a Bearer key, as there)
            userpass = f"{self._url_user}:{self._url_password}".encode()
            self._aio_headers["Authorization"] = "Basic " + base64.b64encode(userpass).decode()
        # the environment's proxy for the endpoint (HTTP(S)_PROXY, ALL_PROXY, NO_PROXY), read
        # once as httpx reads it (aiohttp's trust_env would look it up in a thread per request)
        self._aio_proxy = _env_proxy(self._url.scheme, self._url.host)
        # connect, each read and the wait for a pooled connection, as httpx.Timeout(timeout_s)
        self._aio_timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
        )

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Send one chat completion request, retrying as described in the module docstring.

        Raises:
            LLMStatusError, LLMConnectionError, LLMResponseError: see the class docstring.
        """
        payload, text = self._payload(request)
        # the whole body (messages, tools and a few small fields), not serialised twice
        prompt_estimate = estimate_tokens(text)
        attempts = 0
        billed = TokenUsage()  # usage reported by attempts that failed

        async def attempt() -> CompletionResponse:
            nonlocal attempts, billed
            attempts += 1
            try:
                async with asyncio.timeout(self.timeout_s):
                    response, content = await self._post(payload)
            except BodyTooLarge as exc:
                raise self._too_large(exc, attempts) from None
            except BodyNotDecodable as exc:
                raise LLMResponseError(
                    f"LLM endpoint {self.shown_url} sent a body that could not be decoded: {exc}"
                ) from None
            except (TimeoutError, httpx.TransportError, aiohttp.ClientPayloadError) as exc:
                cause = _transport_cause(exc)
                timed_out = isinstance(cause, TimeoutError) or (
                    cause is exc and isinstance(exc, httpx.TimeoutException)
                )
                raise _Retryable("timeout" if timed_out else "connection", exc=cause) from exc
            except Exception as exc:  # what else the HTTP stack raises (module docstring)
                what = unusable_answer(exc)
                if what is None:
                    raise _Retryable("connection", exc=exc) from exc
                for secret in self._secrets:
                    what = what.replace(secret, "***")
                raise LLMResponseError(
                    f"LLM endpoint {self.shown_url} {what} ({_attempts(attempts)}; not retried)"
                ) from exc
            if _retryable(response.status_code):
                raise _Retryable(
                    f"http_{response.status_code}",
                    status=response.status_code,
                    answered=_status_text(response),
                    body=_head(response, content),
                    retry_after_s=_retry_after_s(response.headers.get("Retry-After")),
                )
            if not response.is_success:
                raise _status_error(
                    self.shown_url,
                    response.status_code,
                    _status_text(response),
                    _head(response, content),
                    attempts,
                )
            try:
                return parse_chat_completion(
                    response, content, url=self.shown_url, prompt_tokens_estimate=prompt_estimate
                )
            except ErrorReply as exc:
                billed = billed + exc.usage
                answered = f"{response.status_code} with an error ({exc.status})"
                if _retryable(exc.status):
                    raise _Retryable(
                        f"http_{exc.status}", status=exc.status, answered=answered, body=exc.message
                    ) from None
                raise _status_error(
                    self.shown_url, exc.status, answered, exc.message, attempts
                ) from None
            except LLMResponseError as exc:
                billed = billed + exc.usage
                raise

        # The first attempt on its own (nearly every request): tenacity's set-up per call (its
        # objects, inspect's look at the attempt) cost more CPU than parsing the answer.
        # After a retryable failure tenacity takes over, that failure its attempt 1.
        first: _Retryable | None = None
        try:
            reply: CompletionResponse = await attempt()
        except _Retryable as exc:
            first = exc
        except LLMError as exc:
            exc.usage = billed
            raise
        if first is not None:
            try:
                reply = await self._retry(attempt, first)
            except _Retryable as exc:
                error = self._final_error(exc, attempts)
                error.usage = billed
                raise error from exc.exc
            except LLMError as exc:
                exc.usage = billed
                raise
        return reply.model_copy(update={"usage": reply.usage + billed, "endpoint": self.name})

    async def _retry(
        self, attempt: Callable[[], Awaitable[CompletionResponse]], first: _Retryable
    ) -> CompletionResponse:
        """The attempts after a first that failed with ``first``, as tenacity runs them (the
        module docstring's waits; ``first`` counts as attempt 1)."""
        failed: _Retryable | None = first

        async def again() -> CompletionResponse:
            nonlocal failed
            if failed is not None:
                exc, failed = failed, None
                raise exc
            return await attempt()

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(_Retryable),
            sleep=self._sleep,
            before_sleep=self._before_sleep,
            reraise=True,
        )
        return await retrying(again)

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
            session = self._session or self._open_session()
            response = AiohttpAnswer(
                await session.post(
                    self._aio_url,
                    data=payload,
                    headers=self._aio_headers,
                    proxy=self._aio_proxy,
                    allow_redirects=False,
                    timeout=self._aio_timeout,
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

    def _open_session(self) -> aiohttp.ClientSession:
        """aiohttp's session (its pool of at most ``max_connections``, every one kept open for
        the next rounds' requests: httpx.Limits' 5 s keep-alive), made in the running loop;
        certificates verified as httpx verifies them (its default SSL context); bodies left
        compressed (``read_body`` decodes them with bounded output)."""
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            keepalive_timeout=_KEEPALIVE_S,
            ssl=httpx.create_ssl_context(),
        )
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
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
        if isinstance(exc, _Retryable) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, self.backoff_max_s)
        return float(self._jitter(state))

    def _before_sleep(self, state: RetryCallState) -> None:
        if self._on_retry is None:
            return
        exc = state.outcome.exception() if state.outcome is not None else None
        reason = exc.reason if isinstance(exc, _Retryable) else "unknown"
        self._on_retry(state.attempt_number, reason)

    def _too_large(self, exc: BodyTooLarge, attempts: int) -> LLMResponseError:
        limit = f"larger than {self.max_response_bytes_name} ({exc.limit_bytes} bytes)"
        if exc.announced_bytes is not None:
            what = f"announced an answer of {exc.announced_bytes} bytes (Content-Length), {limit}"
            how = "not read"
        else:
            what, how = f"sent an answer {limit}", "reading stopped at the limit"
        return LLMResponseError(
            f"LLM endpoint {self.shown_url} {what}, {how} ({_attempts(attempts)}; not retried)"
        )

    def _final_error(self, exc: _Retryable, attempts: int) -> LLMError:
        if exc.status is not None:
            return _status_error(self.shown_url, exc.status, exc.answered, exc.body, attempts)
        cause = exc.exc
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        if isinstance(cause, TimeoutError):
            detail = "the whole answer had not arrived by the deadline"
        if exc.reason == "timeout":
            return LLMConnectionError(
                f"LLM endpoint {self.shown_url} did not answer within {self.timeout_s:g} s "
                f"({_attempts(attempts)}): {detail}"
            )
        return LLMConnectionError(
            f"could not reach LLM endpoint {self.shown_url} ({_attempts(attempts)}): {detail}"
        )


def unusable_answer(exc: Exception) -> str | None:
    """What an endpoint did, in words, when the HTTP stack failed with ``exc``, which is none
    of httpx's transport errors (those are connection failures or timeouts, retried); ``None``
    when ``exc`` is a connection failure all the same (worth retrying).

    aiohttp's client raises ``ClientResponseError`` for an answer its parser refuses (a
    header line over 8190 bytes, more than 32768 headers, a broken status line, a bad
    ``Content-Length``) and ``httpx-aiohttp`` passes it on unmapped: the endpoint answered
    something that is not HTTP, and asking again gets the same. A connection failure that
    reaches here unmapped (aiohttp's ``ClientConnectionError``, an ``OSError``) is retried.
    Anything else (an httpx error that is not a transport error, a ``ValueError`` of the
    stack) fails the request at once, named by its type.
    """
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return None
    if isinstance(exc, aiohttp.ClientResponseError):
        # its message says what the parser met; its str() would add the URL (a secret in
        # the query) and the request's headers are on it too (the API key): neither is used
        detail = " ".join(str(exc.message).split())[:EXCERPT_CHARS]
        return f"sent an answer that is not valid HTTP ({detail or f'status {exc.status}'})"
    detail = " ".join(str(exc).split())[:EXCERPT_CHARS]
    named = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return f"sent an answer the HTTP client could not read ({named})"


def _transport_cause(exc: BaseException) -> BaseException:
    """What went wrong under an httpx transport error: aiohttp's own exception when the
    aiohttp transport mapped it (its mapping calls a refused connection or a server that hung
    up a ``ConnectTimeout``), else ``exc``."""
    cause = exc.__cause__
    return cause if isinstance(cause, aiohttp.ClientError) else exc


class _Retryable(Exception):
    """An attempt failed in a way worth retrying; carries what the final error needs."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        answered: str = "",
        body: str = "",
        exc: BaseException | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.answered = answered
        self.body = body
        self.exc = exc
        self.retry_after_s = retry_after_s


def shown_url(url: str) -> str:
    """``url`` fit for errors and logs: a password in it and the values of its query replaced
    by ``***`` (they may be credentials: ``user:secret@``, ``?key=…``)."""
    parsed = httpx.URL(url)
    if parsed.password:
        parsed = parsed.copy_with(username=parsed.username, password="***")
    if parsed.query:
        parsed = parsed.copy_with(params=[(k, "***") for k, _ in parsed.params.multi_items()])
    return str(parsed).replace("%2A%2A%2A", "***")


def _retryable(status: int) -> bool:
    return status >= 500 or status in _RETRYABLE_STATUS


def _attempts(n: int) -> str:
    return f"after {n} attempt{'s' if n != 1 else ''}"


def _env_proxy(scheme: str, host: str) -> str | None:
    """The proxy the environment names for ``scheme``://``host`` (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``ALL_PROXY``; none when ``NO_PROXY`` covers the host), as httpx's
    ``trust_env`` reads it."""
    proxies = urllib.request.getproxies_environment()
    # NO_PROXY, as urllib.request reads it (a function typeshed does not list)
    if urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    return proxies.get(scheme) or proxies.get("all") or None


_KEEPALIVE_S = 5.0
"""Seconds an idle pooled connection is kept open (httpx.Limits' ``keepalive_expiry``)."""


class AiohttpAnswer:
    """An aiohttp ``ClientResponse`` under the names the client reads (``Answer``): status,
    reason, headers (case-insensitive ``get``), the charset (``utf-8`` when it names none or
    one Python does not know, as httpx's ``encoding``), the raw body in chunks as they
    arrive; ``aclose`` releases it (a body not read to its end drops the connection)."""

    CHUNK_BYTES = 16 * 1024

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.reason_phrase = response.reason or ""
        self.is_success = 200 <= response.status < 300
        self.headers = response.headers
        self.is_stream_consumed = False
        self.content = b""

    @property
    def encoding(self) -> str:
        charset = self._response.charset
        if charset:
            try:
                return codecs.lookup(charset).name
            except LookupError:
                pass
        return "utf-8"

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.content.iter_chunked(self.CHUNK_BYTES):
            yield chunk

    async def aclose(self) -> None:
        self._response.release()


def _head(response: Answer, content: bytes) -> str:
    """The first ``EXCERPT_CHARS`` characters of a body (4 bytes hold any character)."""
    return body_text(response, content[: 4 * EXCERPT_CHARS])[:EXCERPT_CHARS]


def _status_text(response: Answer) -> str:
    return f"{response.status_code} {response.reason_phrase}".strip()


def _status_error(url: str, status: int, answered: str, body: str, attempts: int) -> LLMStatusError:
    return LLMStatusError(
        f"LLM endpoint {url} answered {answered} {_attempts(attempts)}: "
        f"{excerpt(body) or '(empty body)'}",
        status_code=status,
        body=body[:EXCERPT_CHARS],
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


_JSON_CONTENT = {"Content-Type": "application/json"}
