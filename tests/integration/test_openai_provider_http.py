"""OpenAICompatibleChatModel against FakeLLMServer over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from planner import (
    ChatMessage,
    CompletionRequest,
    LLMConnectionError,
    LLMResponseError,
    LLMStatusError,
)
from tests.fakes import FakeLLMServer, chat_completion_body, down_base_url
from worker.llm import OpenAICompatibleChatModel

REQUEST = CompletionRequest(
    messages=[ChatMessage(role="user", content="What time is it?")],
    tools=[
        {
            "type": "function",
            "function": {
                "name": "clock_now",
                "description": "current time",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ],
)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


async def _no_sleep(_seconds: float) -> None:
    return None


def _model(base_url: str, **kwargs: float | int) -> OpenAICompatibleChatModel:
    return OpenAICompatibleChatModel(
        base_url=base_url, api_key="sk-fake", sleep=_no_sleep, **kwargs
    )


async def test_two_500s_then_a_tool_call(server: FakeLLMServer) -> None:
    server.enqueue(status=500, json={"error": {"message": "overloaded"}})
    server.enqueue_text("upstream died", status=503, headers={"Retry-After": "0"})
    server.enqueue(
        json=chat_completion_body(
            tool_calls=[("clock_now", {"tz": "UTC"})], prompt_tokens=21, completion_tokens=4
        )
    )
    retries: list[tuple[int, str]] = []
    async with OpenAICompatibleChatModel(
        base_url=server.base_url,
        sleep=_no_sleep,
        on_retry=lambda attempt, reason: retries.append((attempt, reason)),
    ) as llm:
        response = await llm.complete(REQUEST)

    (call,) = response.message.tool_calls
    assert (call.name, call.arguments, call.parse_error) == ("clock_now", {"tz": "UTC"}, None)
    assert response.usage.total_tokens == 25
    assert retries == [(1, "http_500"), (2, "http_503")]
    assert len(server.requests) == 3
    assert server.requests[0]["tools"][0]["function"]["name"] == "clock_now"
    assert server.requests[0]["messages"] == [{"role": "user", "content": "What time is it?"}]


async def test_default_responder_answers_when_queue_is_empty(server: FakeLLMServer) -> None:
    async with _model(server.base_url) as llm:
        response = await llm.complete(REQUEST)
    assert response.message.content == "Done."
    assert response.message.tool_calls == ()
    assert server.headers[0]["Authorization"] == "Bearer sk-fake"


async def test_credentials_in_the_url_go_as_basic_auth(server: FakeLLMServer) -> None:
    # a proxy behind basic auth: http://user:secret@host/v1
    base_url = server.base_url.replace("http://", "http://user:s3cret@")
    async with OpenAICompatibleChatModel(base_url=base_url, max_retries=0) as llm:
        response = await llm.complete(REQUEST)
        assert "s3cret" not in llm.shown_url
    assert response.message.content == "Done."
    assert server.headers[0]["Authorization"] == "Basic dXNlcjpzM2NyZXQ="  # user:s3cret


async def test_status_error_quotes_the_body(server: FakeLLMServer) -> None:
    server.enqueue(status=401, json={"error": {"message": "invalid api key"}})
    async with _model(server.base_url) as llm:
        with pytest.raises(LLMStatusError) as info:
            await llm.complete(REQUEST)
    assert info.value.status_code == 401
    assert "answered 401 Unauthorized after 1 attempt" in str(info.value)
    assert "invalid api key" in str(info.value)


async def test_garbage_body_is_a_response_error(server: FakeLLMServer) -> None:
    server.enqueue_text("<html>502 from a proxy, but status 200</html>")
    async with _model(server.base_url) as llm:
        with pytest.raises(LLMResponseError, match="not JSON: <html>502 from a proxy"):
            await llm.complete(REQUEST)


async def test_released_hang_answers_the_held_request(server: FakeLLMServer) -> None:
    server.hang()
    server.enqueue(json=chat_completion_body(content="late"))
    async with _model(server.base_url, max_retries=0) as llm:
        pending = asyncio.ensure_future(llm.complete(REQUEST))
        await asyncio.to_thread(server.wait_for_requests, 1)
        assert not pending.done()
        server.release()
        assert (await pending).message.content == "late"


async def test_down_endpoint_gives_a_readable_connection_error() -> None:
    base_url = down_base_url()
    async with _model(base_url, max_retries=2, backoff_initial_s=0.001) as llm:
        with pytest.raises(LLMConnectionError) as info:
            await llm.complete(REQUEST)
    message = str(info.value)
    assert message.startswith(
        f"could not reach LLM endpoint {base_url}/chat/completions (after 3 attempts): "
        "ClientConnectorError: Cannot connect to host"
    )


async def test_server_stopped_while_hanging_is_a_connection_error() -> None:
    server = FakeLLMServer().start()
    server.hang()
    async with _model(server.base_url, max_retries=0) as llm:
        pending = asyncio.ensure_future(llm.complete(REQUEST))
        await asyncio.to_thread(server.wait_for_requests, 1)
        assert not pending.done()  # held open by hang()
        await asyncio.to_thread(server.stop)  # drops the held request without an answer
        with pytest.raises(
            LLMConnectionError, match="ServerDisconnectedError: Server disconnected"
        ):
            await pending


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        # the tester's: one header over aiohttp's 8190-byte line limit, and 100k headers
        ({"value_bytes": 9000}, "Got more than 8190 bytes when reading"),
        ({"count": 100_000}, "Too many headers received"),
    ],
)
async def test_an_answer_whose_headers_no_client_parses_is_unusable_and_not_retried(
    server: FakeLLMServer, headers: dict[str, int], said: str
) -> None:
    server.enqueue_header_flood(**headers)
    async with _model(server.base_url, max_retries=3) as model:
        with pytest.raises(LLMResponseError) as caught:
            await model.complete(REQUEST)
    message = str(caught.value)
    assert message.startswith(
        f"LLM endpoint http://127.0.0.1:{server.port}/v1/chat/completions sent an answer that "
        "is not valid HTTP ("
    ), message
    assert said in message
    assert message.endswith("(after 1 attempt; not retried)")
    assert "sk-fake" not in message  # the API key rides on aiohttp's error
    assert len(server.requests) == 1  # the same endpoint would answer the same


async def test_the_fallback_answers_when_the_primary_sends_headers_no_client_parses(
    server: FakeLLMServer,
) -> None:
    from worker.llm import FallbackChatModel

    server.enqueue_header_flood(value_bytes=9000)
    with FakeLLMServer() as backup:
        backup.enqueue(json=chat_completion_body("from the fallback"))
        primary = OpenAICompatibleChatModel(base_url=server.base_url, name="primary")
        fallback = OpenAICompatibleChatModel(base_url=backup.base_url, name="fallback")
        async with FallbackChatModel(primary, fallback) as model:
            response = await model.complete(REQUEST)
    assert (response.endpoint, response.message.content) == ("fallback", "from the fallback")
