"""What each kind of reply makes the loop do (planner.replies), with the scripted model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner import (
    ChatMessage,
    CompletionResponse,
    PlannerLoopInput,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.replies import TRUNCATED_NOTE
from planner.testing import ScriptedChatModel, final_answer

ran: list[str] = []


async def _clock(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append("clock_now")
    return "12:00"


CLOCK = ToolSpec("clock_now", "time", {"type": "object", "properties": {}}, "read", _clock)


def said(
    content: str | None, finish_reason: str | None, *calls: ToolCall, endpoint: str | None = None
) -> CompletionResponse:
    return CompletionResponse(
        message=ChatMessage(role="assistant", content=content, tool_calls=calls),
        usage=TokenUsage(prompt_tokens=10, completion_tokens=5),
        finish_reason=finish_reason,
        endpoint=endpoint,
    )


def inp(max_rounds: int = 3) -> PlannerLoopInput:
    return PlannerLoopInput("sys", "What time is it?", tools=[CLOCK], max_rounds=max_rounds)


@pytest.mark.parametrize(
    ("reply", "stop_reason", "error"),
    [
        (said("It is noon.", "stop"), "final_answer", None),
        (said("It is noon.", None), "final_answer", None),  # no finish reason given
        (said("It is noon.", "eos"), "final_answer", None),  # one the loop does not know
        (said(None, "stop"), "empty_answer", "no text and no tool calls (finish_reason 'stop')"),
        (said("  \n", None), "empty_answer", "no text and no tool calls (finish_reason None)"),
        (said(None, "content_filter"), "content_filtered", "withheld or filtered"),
        (said("Partial", "content_filter"), "content_filtered", "withheld or filtered"),
        (said(None, "error"), "llm_error", "reported an error instead of an answer"),
        (said("Let me check.", "tool_calls"), "llm_error", "reported tool calls but sent none"),
    ],
)
async def test_each_reply_kind_ends_the_loop_as_decided(
    reply: CompletionResponse, stop_reason: str, error: str | None
) -> None:
    result = await run_planner_loop(inp(), llm=ScriptedChatModel([reply]))
    assert result.stop_reason == stop_reason
    assert result.failed is (error is not None)
    assert (result.error is None) if error is None else (error in (result.error or ""))
    assert result.final_answer == ("It is noon." if stop_reason == "final_answer" else None)


async def test_a_cut_answer_is_kept_and_the_model_is_told_and_asked_again() -> None:
    llm = ScriptedChatModel(
        [said("Steps: 1. Read the notes 2. Call the", "length"), final_answer("It is noon.")]
    )
    result = await run_planner_loop(inp(), llm=llm)
    assert (result.stop_reason, result.final_answer, result.rounds) == (
        "final_answer",
        "It is noon.",
        2,
    )
    cut, note = result.messages[2], result.messages[3]
    assert cut.content == "Steps: 1. Read the notes 2. Call the"
    assert cut.reply_info is not None and cut.reply_info.finish_reason == "length"
    assert note == ChatMessage(role="user", content=TRUNCATED_NOTE)
    assert llm.requests[1].messages[-1] == note


async def test_a_cut_answer_in_the_last_round_fails_as_truncated() -> None:
    result = await run_planner_loop(
        inp(max_rounds=1), llm=ScriptedChatModel([said("1. Re", "length")])
    )
    assert result.stop_reason == "truncated" and result.failed
    assert "cut off at the output-token limit" in (result.error or "")
    assert result.final_answer is None


async def test_a_filtered_reply_with_tool_calls_runs_none_and_answers_each() -> None:
    ran.clear()
    call = ToolCall(id="c1", name="clock_now")
    result = await run_planner_loop(
        inp(), llm=ScriptedChatModel([said(None, "content_filter", call)])
    )
    assert ran == [] and result.executed_calls == []
    assert result.stop_reason == "content_filtered"
    tool = result.messages[-1]
    assert tool.role == "tool" and tool.tool_call_id == "c1"
    assert json.loads(tool.content or "")["error"] == "not run: the endpoint filtered this reply"


async def test_tool_calls_run_whatever_the_finish_reason_says() -> None:
    ran.clear()
    call = ToolCall(id="c1", name="clock_now")
    llm = ScriptedChatModel(
        [said(None, "stop", call), said(None, "length", call), final_answer("ok")]
    )
    result = await run_planner_loop(inp(), llm=llm)
    assert ran == ["clock_now", "clock_now"] and result.stop_reason == "final_answer"


async def test_the_stored_reply_records_endpoint_finish_reason_and_usage() -> None:
    llm = ScriptedChatModel([said("It is noon.", "stop", endpoint="fallback")])
    result = await run_planner_loop(inp(), llm=llm)
    info = result.messages[-1].reply_info
    assert info is not None
    assert (info.endpoint, info.finish_reason) == ("fallback", "stop")
    assert info.usage == TokenUsage(prompt_tokens=10, completion_tokens=5)
    assert result.messages[-1].to_json()["reply_info"]["endpoint"] == "fallback"
