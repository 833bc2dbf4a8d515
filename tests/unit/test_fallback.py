"""FallbackChatModel with scripted models: who is asked, with which model, and what is raised."""

from __future__ import annotations

import pytest

from planner import (
    ChatMessage,
    CompletionRequest,
    LLMError,
    LLMResponseError,
    LLMStatusError,
    TokenUsage,
)
from planner.testing import ScriptedChatModel, final_answer
from worker.llm import FallbackChatModel

REQUEST = CompletionRequest(messages=[ChatMessage(role="user", content="hi")], model="big")
BILLED = TokenUsage(prompt_tokens=7)


async def test_the_primary_answers_and_the_fallback_is_not_asked() -> None:
    primary, fallback = ScriptedChatModel([final_answer("p")]), ScriptedChatModel([])
    response = await FallbackChatModel(primary, fallback).complete(REQUEST)
    assert response.message.content == "p" and fallback.requests == []


@pytest.mark.parametrize(
    "error",
    [
        LLMStatusError("answered 401", status_code=401, body="", usage=BILLED),
        LLMResponseError("answered 200 with no choices", usage=BILLED),
        LLMError("could not reach", usage=BILLED),
    ],
)
async def test_any_failure_of_the_primary_asks_the_fallback(error: LLMError) -> None:
    seen: list[LLMError] = []
    primary = ScriptedChatModel([error])
    fallback = ScriptedChatModel([final_answer("f", usage=TokenUsage(prompt_tokens=3))])
    model = FallbackChatModel(primary, fallback, fallback_model="small", on_fallback=seen.append)
    response = await model.complete(REQUEST)
    assert response.message.content == "f"
    assert fallback.requests[0].model == "small"
    assert response.usage == TokenUsage(prompt_tokens=10)  # what the primary billed counts
    assert seen == [error]


async def test_both_failing_raises_one_error_naming_both() -> None:
    primary = ScriptedChatModel([LLMError("primary is down", usage=BILLED)])
    fallback = ScriptedChatModel([LLMError("fallback is down", usage=BILLED)])
    with pytest.raises(LLMError) as info:
        await FallbackChatModel(primary, fallback).complete(REQUEST)
    assert str(info.value) == (
        "primary is down; then the fallback endpoint failed too: fallback is down"
    )
    assert info.value.usage == TokenUsage(prompt_tokens=14)
    assert fallback.requests[0].model == "big"  # no fallback_model: the request's model
