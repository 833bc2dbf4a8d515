"""OpenAICompatibleChatModel over httpx.MockTransport: retries, errors, wire format (no sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from planner import (
    ChatMessage,
    CompletionRequest,
    LLMConnectionError,
    LLMResponseError,
    LLMStatusError,
    ToolCall,
)
from worker.llm import OpenAICompatibleChatModel

BASE_URL = "http://llm.test/v1"

Handler = Callable[[httpx.Request], httpx.Response]


def completion(
    *,
    content: str | None = "done",
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, int] | None = None,
    finish_reason: str = "stop",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


class Recorder:
    """Scripted transport: answers requests from a list of handlers and records them."""

    def __init__(self, *steps: Handler | httpx.Response | Exception) -> None:
        self._steps: Iterator[Handler | httpx.Response | Exception] = iter(steps)
        self.requests: list[httpx.Request] = []
        self.waits: list[float] = []
        self.retries: list[tuple[int, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = next(self._steps)
        if isinstance(step, Exception):
            raise step
        if isinstance(step, httpx.Response):
            return step
        return step(request)

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)

    def model(self, **kwargs: Any) -> OpenAICompatibleChatModel:
        return OpenAICompatibleChatModel(
            base_url=BASE_URL,
            transport=httpx.MockTransport(self.handle),
            sleep=self.sleep,
            on_retry=lambda attempt, reason: self.retries.append((attempt, reason)),
            **kwargs,
        )

    def body(self, index: int = 0) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.requests[index].content)
        return parsed


REQUEST = CompletionRequest(messages=[ChatMessage(role="user", content="hi")])


async def test_retries_5xx_then_succeeds_with_jittered_backoff() -> None:
    rec = Recorder(
        httpx.Response(500, text="boom"),
        httpx.Response(502, text="bad gateway"),
        httpx.Response(200, json=completion(content="hello")),
    )
    async with rec.model(backoff_initial_s=0.5) as llm:
        response = await llm.complete(REQUEST)

    assert response.message == ChatMessage(role="assistant", content="hello")
    assert len(rec.requests) == 3
    assert rec.retries == [(1, "http_500"), (2, "http_502")]
    # Full jitter: retry n waits uniform(0, initial * 2**(n-1)).
    assert len(rec.waits) == 2
    assert 0 <= rec.waits[0] <= 0.5
    assert 0 <= rec.waits[1] <= 1.0


async def test_429_retry_after_seconds_is_honoured() -> None:
    rec = Recorder(
        httpx.Response(429, headers={"Retry-After": "7"}, text="slow down"),
        httpx.Response(200, json=completion()),
    )
    async with rec.model() as llm:
        await llm.complete(REQUEST)
    assert rec.waits == [7.0]
    assert rec.retries == [(1, "http_429")]


async def test_retry_after_is_capped_by_backoff_max() -> None:
    rec = Recorder(
        httpx.Response(503, headers={"Retry-After": "120"}),
        httpx.Response(429, headers={"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"}),
        httpx.Response(429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        httpx.Response(200, json=completion()),
    )
    async with rec.model(backoff_max_s=10.0) as llm:
        await llm.complete(REQUEST)
    # delta-seconds capped, a far-future HTTP-date capped, a past HTTP-date means "now".
    assert rec.waits == [10.0, 10.0, 0.0]


async def test_400_fails_at_once_with_status_and_body() -> None:
    rec = Recorder(httpx.Response(400, json={"error": {"message": "unknown model 'x'"}}))
    async with rec.model() as llm:
        with pytest.raises(LLMStatusError) as info:
            await llm.complete(REQUEST)

    assert len(rec.requests) == 1
    assert rec.waits == []
    assert info.value.status_code == 400
    assert "unknown model 'x'" in info.value.body
    assert str(info.value).startswith(
        f"LLM endpoint {BASE_URL}/chat/completions answered 400 Bad Request after 1 attempt:"
    )


async def test_5xx_exhausts_retries_then_status_error() -> None:
    long_body = "x" * 2000
    rec = Recorder(*(httpx.Response(500, text=long_body) for _ in range(4)))
    async with rec.model(max_retries=3) as llm:
        with pytest.raises(LLMStatusError) as info:
            await llm.complete(REQUEST)

    assert len(rec.requests) == 4
    assert len(rec.waits) == 3
    assert info.value.status_code == 500
    assert len(info.value.body) == 500
    assert "answered 500 Internal Server Error after 4 attempts: xxx" in str(info.value)


async def test_connection_error_after_all_attempts() -> None:
    rec = Recorder(*(httpx.ConnectError("connection refused") for _ in range(3)))
    async with rec.model(max_retries=2) as llm:
        with pytest.raises(LLMConnectionError) as info:
            await llm.complete(REQUEST)

    assert len(rec.requests) == 3
    assert rec.retries == [(1, "connection"), (2, "connection")]
    assert str(info.value) == (
        f"could not reach LLM endpoint {BASE_URL}/chat/completions (after 3 attempts): "
        "ConnectError: connection refused"
    )


async def test_timeout_is_retried_and_reported() -> None:
    rec = Recorder(httpx.ReadTimeout("timed out"), httpx.Response(200, json=completion()))
    async with rec.model() as llm:
        await llm.complete(REQUEST)
    assert rec.retries == [(1, "timeout")]

    rec = Recorder(httpx.ReadTimeout("timed out"))
    async with rec.model(max_retries=0, timeout_s=5) as llm:
        expected = r"did not answer within 5 s \(after 1 attempt\)"
        with pytest.raises(LLMConnectionError, match=expected):
            await llm.complete(REQUEST)


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("<html>gateway</html>", "not JSON"),
        ("[1, 2]", "not an object"),
        ('{"choices": []}', "no choices"),
        ('{"choices": [{"text": "legacy"}]}', "without a message object"),
        ('{"choices": [{"message": {"content": 3}}]}', "neither a string nor null"),
    ],
)
async def test_unusable_2xx_body_is_a_response_error(body: str, what: str) -> None:
    rec = Recorder(httpx.Response(200, text=body))
    async with rec.model() as llm:
        with pytest.raises(LLMResponseError) as info:
            await llm.complete(REQUEST)
    assert what in str(info.value)
    assert body[:20] in str(info.value)
    assert len(rec.requests) == 1


async def test_tool_calls_are_parsed_and_bad_arguments_do_not_raise() -> None:
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "clock_now", "arguments": '{"tz": "UTC"}'},
        },
        {"id": "call_2", "function": {"name": "notes_create", "arguments": "{"}},
        {"type": "function", "function": {"name": "notes_list", "arguments": "[1]"}},
        {"id": "call_4", "type": "function", "function": {"name": "noop", "arguments": ""}},
    ]
    rec = Recorder(
        httpx.Response(
            200,
            json=completion(
                content=None,
                tool_calls=calls,
                usage={"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
                finish_reason="tool_calls",
            ),
        )
    )
    async with rec.model() as llm:
        response = await llm.complete(REQUEST)

    got = response.message.tool_calls
    assert response.message.content is None
    assert response.finish_reason == "tool_calls"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (12, 7)
    assert got[0] == ToolCall(id="call_1", name="clock_now", arguments={"tz": "UTC"})
    assert got[1].arguments == {}
    assert got[1].parse_error is not None and "not valid JSON" in got[1].parse_error
    assert got[2].parse_error == "arguments must be a JSON object, got an array"
    assert got[2].id  # generated when the provider sent none
    assert got[2].id != got[1].id
    assert got[3] == ToolCall(id="call_4", name="noop", arguments={})


async def test_missing_usage_is_estimated_and_marked() -> None:
    rec = Recorder(httpx.Response(200, json=completion(content="x" * 40)))
    async with rec.model() as llm:
        response = await llm.complete(REQUEST)
    # 4 characters per token: the 40-character answer is 10 tokens; the prompt is its JSON
    assert response.usage.completion_tokens == 10
    assert response.usage.prompt_tokens > 0
    assert response.usage.estimated
    assert response.finish_reason == "stop"


async def test_request_body_and_headers() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "clock_now",
            "description": "current time",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    request = CompletionRequest(
        messages=[
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content="time?"),
            ChatMessage(
                role="assistant",
                tool_calls=(ToolCall(id="c1", name="clock_now", arguments={"tz": "Europe/Paris"}),),
            ),
            ChatMessage(role="tool", tool_call_id="c1", content='{"now": "12:00"}'),
        ],
        tools=[tool],
        tool_choice="required",
        temperature=0.2,
        max_tokens=64,
    )
    rec = Recorder(httpx.Response(200, json=completion()))
    async with rec.model(api_key="sk-test", default_model="gpt-test") as llm:
        await llm.complete(request)

    sent = rec.requests[0]
    assert sent.method == "POST"
    assert str(sent.url) == f"{BASE_URL}/chat/completions"
    assert sent.headers["Authorization"] == "Bearer sk-test"
    assert rec.body() == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "clock_now", "arguments": '{"tz": "Europe/Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"now": "12:00"}'},
        ],
        "tools": [tool],
        "tool_choice": "required",
        "temperature": 0.2,
        "max_tokens": 64,
    }


async def test_defaults_are_left_out_of_the_body() -> None:
    rec = Recorder(httpx.Response(200, json=completion()), httpx.Response(200, json=completion()))
    async with rec.model(default_model="fallback") as llm:
        await llm.complete(REQUEST)
        await llm.complete(REQUEST.model_copy(update={"model": "chosen"}))

    assert "Authorization" not in rec.requests[0].headers
    assert rec.body(0) == {"model": "fallback", "messages": [{"role": "user", "content": "hi"}]}
    assert rec.body(1)["model"] == "chosen"

    rec = Recorder(httpx.Response(200, json=completion()))
    async with rec.model() as llm:
        await llm.complete(REQUEST.model_copy(update={"tool_choice": "none"}))
    assert rec.body() == {"messages": [{"role": "user", "content": "hi"}]}


def test_base_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAICompatibleChatModel(base_url="localhost:8000/v1")


@pytest.mark.parametrize(
    "failure",
    [httpx.Response(500, json={"error": "boom"}), httpx.ConnectError("refused")],
    ids=["status", "connection"],
)
async def test_credentials_in_the_base_url_are_used_but_never_shown(failure: Any) -> None:
    rec = Recorder(failure)
    model = OpenAICompatibleChatModel(
        base_url="http://carol:pw789@llm.test/v1?key=APIKEY123",
        transport=httpx.MockTransport(rec.handle),
        sleep=rec.sleep,
        max_retries=0,
    )
    with pytest.raises((LLMStatusError, LLMConnectionError)) as caught:
        await model.complete(REQUEST)
    [sent] = rec.requests
    # the path goes before the query, and the credentials are sent
    assert sent.url.path == "/v1/chat/completions" and sent.url.params["key"] == "APIKEY123"
    message = str(caught.value)
    assert "pw789" not in message and "APIKEY123" not in message
    assert "http://carol:***@llm.test/v1/chat/completions?key=***" in message


async def _stream(data: bytes, size: int = 16 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
async def test_an_answer_over_the_cap_fails_at_once_naming_the_limit(announced: bool) -> None:
    body = json.dumps(completion(content="x" * 5000)).encode()
    headers = {"Content-Length": str(len(body))} if announced else {}
    rec = Recorder(httpx.Response(200, headers=headers, content=_stream(body)))
    async with rec.model(
        max_retries=3, max_response_bytes=4096, max_response_bytes_name="THE_CAP"
    ) as llm:
        with pytest.raises(LLMResponseError) as info:
            await llm.complete(REQUEST)
    assert "larger than THE_CAP (4096 bytes)" in str(info.value)
    assert "(after 1 attempt; not retried)" in str(info.value)
    assert (len(rec.requests), rec.retries) == (1, [])


async def test_an_answer_at_the_cap_is_read() -> None:
    body = json.dumps(completion(content="fits")).encode()
    rec = Recorder(httpx.Response(200, content=_stream(body, 7)))
    async with rec.model(max_response_bytes=len(body)) as llm:
        response = await llm.complete(REQUEST)
    assert response.message.content == "fits"


async def _flood(chunk: bytes, count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield chunk


async def test_a_long_error_body_is_quoted_from_its_head_and_retried() -> None:
    rec = Recorder(
        *(httpx.Response(503, content=_flood(b"overloaded " * 1500, 1000)) for _ in range(2))
    )  # 16 MB each, over the cap: an error is read only for its text, and still retried
    async with rec.model(max_retries=1, max_response_bytes=1024) as llm:
        with pytest.raises(LLMStatusError) as info:
            await llm.complete(REQUEST)
    assert rec.retries == [(1, "http_503")]
    assert "answered 503 Service Unavailable after 2 attempts: overloaded overloaded" in str(
        info.value
    )
    assert len(info.value.body) == 500


async def test_an_error_body_that_does_not_decode_keeps_the_status_and_its_retry() -> None:
    rec = Recorder(
        httpx.Response(502, headers={"Content-Encoding": "br"}, content=_stream(b"\x1b\x00")),
        httpx.Response(200, json=completion(content="later")),
    )
    async with rec.model() as llm:
        assert (await llm.complete(REQUEST)).message.content == "later"
    assert rec.retries == [(1, "http_502")]


async def test_an_answer_in_a_coding_not_asked_for_is_unusable() -> None:
    rec = Recorder(httpx.Response(200, headers={"Content-Encoding": "br"}, content=_stream(b"x")))
    async with rec.model() as llm:
        with pytest.raises(LLMResponseError) as info:
            await llm.complete(REQUEST)
    assert "could not be decoded: Content-Encoding 'br', which was not asked for" in str(info.value)
    assert (len(rec.requests), rec.retries) == (1, [])


async def test_only_codings_it_can_bound_are_asked_for() -> None:
    rec = Recorder(httpx.Response(200, json=completion()))
    async with rec.model() as llm:
        await llm.complete(REQUEST)
    assert rec.requests[0].headers["Accept-Encoding"] == "gzip, deflate"


def test_the_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_response_bytes must be >= 1"):
        OpenAICompatibleChatModel(base_url=BASE_URL, max_response_bytes=0)


def _unparseable_answer(message: str) -> Exception:
    """What aiohttp's client raises for an answer its HTTP parser refuses (the request's
    headers, with the API key, ride on it)."""
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    headers = CIMultiDictProxy(CIMultiDict({"Authorization": "Bearer sk-secret"}))
    info = aiohttp.RequestInfo(URL(BASE_URL), "POST", headers, URL(BASE_URL))
    return aiohttp.ClientResponseError(info, (), status=400, message=message)


@pytest.mark.parametrize(
    "said",
    [
        "Got more than 8190 bytes when reading: b'aaaa'.",  # a header line over the limit
        "Too many headers received",  # 100k headers
    ],
)
async def test_an_answer_the_http_client_cannot_parse_is_unusable_and_not_retried(
    said: str,
) -> None:
    rec = Recorder(_unparseable_answer(said))
    async with rec.model(api_key="sk-secret", max_retries=3) as llm:
        with pytest.raises(LLMResponseError) as caught:
            await llm.complete(REQUEST)
    assert str(caught.value) == (
        f"LLM endpoint {BASE_URL}/chat/completions sent an answer that is not valid HTTP "
        f"({said}) (after 1 attempt; not retried)"
    )
    assert len(rec.requests) == 1 and rec.retries == []


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param("server_disconnected", id="aiohttp-connection-error-unmapped"),
        pytest.param("reset", id="raw-os-error"),
    ],
)
async def test_a_connection_failure_the_http_stack_passes_on_unmapped_is_retried(
    failure: str,
) -> None:
    import aiohttp

    exc: Exception = (
        aiohttp.ServerDisconnectedError()
        if failure == "server_disconnected"
        else ConnectionResetError(104, "Connection reset by peer")
    )
    rec = Recorder(exc, httpx.Response(200, json=completion(content="back")))
    async with rec.model() as llm:
        response = await llm.complete(REQUEST)
    assert response.message.content == "back"
    assert rec.retries == [(1, "connection")]


@pytest.mark.parametrize(
    ("exc", "named"),
    [
        (ValueError("bad header value sk-secret"), "ValueError: bad header value ***"),
        (httpx.DecodingError("garbled"), "DecodingError: garbled"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "UnicodeDecodeError"),
    ],
)
async def test_any_other_failure_of_the_http_stack_is_an_llm_error_naming_it(
    exc: Exception, named: str
) -> None:
    rec = Recorder(exc, httpx.Response(200, json=completion()))
    async with rec.model(api_key="sk-secret") as llm:
        with pytest.raises(LLMResponseError) as caught:
            await llm.complete(REQUEST)
    message = str(caught.value)
    assert f"sent an answer the HTTP client could not read ({named}" in message
    assert message.endswith("(after 1 attempt; not retried)")
    assert "sk-secret" not in message
    assert len(rec.requests) == 1


@pytest.mark.parametrize(
    ("env", "url", "proxy"),
    [
        ({}, "http://llm.example/v1", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://llm.example/v1", "http://proxy:3128"),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://llm.example/v1", None),
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://llm.example/v1", "http://proxy:3128"),
        ({"ALL_PROXY": "http://proxy:3128"}, "https://llm.example/v1", "http://proxy:3128"),
        (
            {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "llm.example"},
            "http://llm.example/v1",
            None,
        ),
    ],
)
def test_the_environments_proxy_is_read_once_as_httpx_reads_it(
    env: dict[str, str], url: str, proxy: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert OpenAICompatibleChatModel(base_url=url)._aio.proxy == proxy
