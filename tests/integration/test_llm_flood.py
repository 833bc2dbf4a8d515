"""An LLM endpoint that floods: answers far larger than ``MANA_AI_LLM_MAX_RESPONSE_BYTES``,
over real HTTP on 127.0.0.1 (FakeLLMServer's flood mode), against the worker's chat models.

What an operator relies on: such an answer fails at once with an error naming the limit, is
not retried, goes to the fallback when there is one, and costs the worker memory of the cap,
not of the body (a 200 MB answer once cost +325 MiB for one request).
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from planner import ChatMessage, CompletionRequest, CompletionResponse, LLMError, LLMStatusError
from planner.llm import ChatModel
from tests.fakes import FakeLLMServer
from tests.fakes.llm_server import FLOOD_MIN_BYTES
from worker.llm.chat_models import InstrumentedChatModel, build_chat_model, build_summariser
from worker.settings import load_settings

MIB = 1024 * 1024
FLOOD_BYTES = 200_000_000
CAP_TEXT = "larger than MANA_AI_LLM_MAX_RESPONSE_BYTES"
REQUEST = CompletionRequest(messages=[ChatMessage(role="user", content="What time is it?")])
T = TypeVar("T")

KINDS = {
    "content-length": {},
    "chunked": {"content_length": False},
    "gzip": {"gzip": True},
    "gzip-chunked": {"gzip": True, "content_length": False},
}


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


@pytest.fixture
async def chat_model(server: FakeLLMServer) -> AsyncIterator[Callable[..., InstrumentedChatModel]]:
    """``build(**settings)`` → the worker's chat model against ``server``; closed afterwards."""
    built: list[InstrumentedChatModel] = []

    def build(**settings: Any) -> InstrumentedChatModel:
        options: dict[str, Any] = {"llm_base_url": server.base_url, "llm_max_retries": 3}
        llm = build_chat_model(load_settings(**(options | settings)))
        built.append(llm)
        return llm

    yield build
    for llm in built:
        await llm.aclose()


async def traced(call: Awaitable[T]) -> tuple[T | BaseException, int, int]:
    """``(what call returned or raised, the peak of the memory it allocated, what of it is
    still allocated afterwards)``, in bytes. The garbage collector is off meanwhile: what
    only a collection would free counts as held."""
    gc.disable()
    tracemalloc.start()
    try:
        try:
            outcome: T | BaseException = await call
        except Exception as exc:
            outcome = exc
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    return outcome, peak, held


async def complete(llm: ChatModel) -> CompletionResponse:
    return await llm.complete(REQUEST)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_200_mb_answer_fails_at_once_with_the_cap_in_the_error_and_is_not_retried(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel], kind: str
) -> None:
    server.enqueue_flood(FLOOD_BYTES, **KINDS[kind])
    llm = chat_model()  # 3 retries, the default cap of 8 MiB
    outcome, peak, held = await traced(complete(llm))

    assert isinstance(outcome, LLMError), outcome
    assert f"{CAP_TEXT} (8388608 bytes)" in str(outcome)
    assert "not retried" in str(outcome)
    assert len(server.requests) == 1
    # the worker held the cap at most, not the body (with the whole body read: > 400 MiB)
    assert peak < 32 * MIB, f"{peak / MIB:.1f} MiB"
    # and let go of it at once, though the error (and the traceback it holds) is kept
    assert held < 2 * MIB, f"{held / MIB:.1f} MiB"
    # and it hung up: the endpoint could not write the rest (only the sockets' buffers took some)
    [sent] = await asyncio.to_thread(server.wait_for_floods, 1)
    assert sent < 64 * MIB, f"{sent / MIB:.1f} MiB"


async def test_a_content_length_over_the_cap_is_refused_before_the_body_is_read(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel]
) -> None:
    server.enqueue_flood(FLOOD_BYTES)
    outcome, peak, _ = await traced(complete(chat_model()))
    assert isinstance(outcome, LLMError)
    assert (
        f"announced an answer of {FLOOD_BYTES} bytes (Content-Length), "
        f"{CAP_TEXT} (8388608 bytes), not read" in str(outcome)
    )
    assert peak < 2 * MIB


@pytest.mark.parametrize("kind", KINDS)
async def test_an_answer_at_the_cap_still_works_and_one_byte_more_does_not(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel], kind: str
) -> None:
    server.enqueue_flood(MIB, **KINDS[kind])
    server.enqueue_flood(MIB + 1, **KINDS[kind])
    llm = chat_model(llm_max_response_bytes=MIB)

    response = await complete(llm)
    assert response.message.content == ("flood " * MIB)[: MIB - FLOOD_MIN_BYTES]
    with pytest.raises(LLMError, match=f"{CAP_TEXT} \\(1048576 bytes\\)"):
        await complete(llm)
    assert len(server.requests) == 2


async def test_a_100_mb_error_body_is_read_only_for_its_text(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel]
) -> None:
    server.enqueue_flood(100_000_000, status=500)
    server.enqueue_flood(100_000_000, status=500, content_length=False)
    server.enqueue_completion("It is noon.")
    llm = chat_model()

    outcome, peak, _ = await traced(complete(llm))

    assert isinstance(outcome, CompletionResponse), outcome  # a 500 is retried, as always
    assert outcome.message.content == "It is noon."
    assert len(server.requests) == 3
    assert peak < 4 * MIB, f"{peak / MIB:.1f} MiB"
    assert all(sent < 64 * MIB for sent in await asyncio.to_thread(server.wait_for_floods, 2))


async def test_the_error_of_a_flooding_500_quotes_its_head(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel]
) -> None:
    server.enqueue_flood(100_000_000, status=500)
    with pytest.raises(LLMStatusError) as info:
        await complete(chat_model(llm_max_retries=0))
    assert 'answered 500 Internal Server Error after 1 attempt: {"id": "chatcmpl-flood"' in str(
        info.value
    )


async def test_a_flooding_primary_goes_to_the_fallback_which_has_the_same_cap(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel]
) -> None:
    with FakeLLMServer() as fallback:
        server.enqueue_flood(FLOOD_BYTES, content_length=False)
        fallback.enqueue_completion("from the fallback")
        llm = chat_model(llm_fallback_base_url=fallback.base_url)
        response = await complete(llm)
        assert (response.message.content, response.endpoint) == ("from the fallback", "fallback")
        assert (len(server.requests), len(fallback.requests)) == (1, 1)

        server.enqueue_flood(FLOOD_BYTES, content_length=False)
        fallback.enqueue_flood(FLOOD_BYTES, gzip=True)
        with pytest.raises(LLMError) as info:
            await complete(llm)
        assert str(info.value).count(CAP_TEXT) == 2  # both endpoints', in one error
        assert (len(server.requests), len(fallback.requests)) == (2, 2)


async def test_the_compaction_summariser_has_the_same_cap(
    server: FakeLLMServer, chat_model: Callable[..., InstrumentedChatModel]
) -> None:
    with FakeLLMServer() as summariser_endpoint:
        summariser_endpoint.enqueue_flood(FLOOD_BYTES, content_length=False)
        settings = load_settings(
            llm_base_url=server.base_url,
            compact_base_url=summariser_endpoint.base_url,
            llm_max_response_bytes=MIB,
        )
        chat = chat_model()
        summariser = build_summariser(settings, chat)
        try:
            with pytest.raises(LLMError, match=f"{CAP_TEXT} \\(1048576 bytes\\)"):
                await complete(summariser)
        finally:
            await summariser.aclose()
        assert len(summariser_endpoint.requests) == 1
        assert server.requests == []
