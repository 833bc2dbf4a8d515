"""Every reply kind real OpenAI-compatible endpoints send, over real HTTP: the planner loop with
OpenAICompatibleChatModel against FakeLLMServer playing a strict backend.

One section per kind of issue #9, each with the issue's example and inputs of the same kind.
The server refuses (400) what strict providers refuse: repeated tool-call ids, invalid tool
names, arguments that are not a JSON object, and (per test) missing provider fields or schema
keywords it does not know.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from planner import (
    ChatMessage,
    LLMConnectionError,
    LLMStatusError,
    PlannerLoopInput,
    PlannerLoopResult,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.replies import TRUNCATED_NOTE
from tests.fakes import FakeLLMServer, RequestCheck, down_base_url
from tests.fakes.provider_zoo import (
    Call,
    arguments_are_json_objects,
    choice_error,
    error_in_200,
    refuses_schema_keywords,
    reply,
    requires_assistant_field,
    unique_tool_call_ids,
    valid_tool_names,
)
from worker.llm import FallbackChatModel, OpenAICompatibleChatModel

STRICT: list[RequestCheck] = [unique_tool_call_ids, valid_tool_names, arguments_are_json_objects]

saved: list[dict[str, Any]] = []


async def _clock_now(args: dict[str, Any], ctx: ToolContext) -> dict[str, str]:
    return {"now": "12:00"}


async def _save_note(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    saved.append(args)
    return {"id": len(saved)}


TOOLS = [
    ToolSpec(
        "clock_now",
        "The current time.",
        {"type": "object", "properties": {}, "additionalProperties": False},
        "read",
        _clock_now,
    ),
    ToolSpec(
        "save_note",
        "Save a note.",
        {
            "type": "object",
            "properties": {"title": {"type": "string", "minLength": 1}},
            "required": ["title"],
            "additionalProperties": False,
        },
        "write",
        _save_note,
    ),
]


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    saved.clear()
    with FakeLLMServer(checks=STRICT) as srv:
        yield srv


async def _no_sleep(_seconds: float) -> None:
    return None


def model(base_url: str, **kwargs: Any) -> OpenAICompatibleChatModel:
    options: dict[str, Any] = {"sleep": _no_sleep, "max_retries": 2, "name": "primary"}
    return OpenAICompatibleChatModel(base_url=base_url, **(options | kwargs))


async def run(server: FakeLLMServer, *, max_rounds: int = 5, **kwargs: Any) -> PlannerLoopResult:
    inp = PlannerLoopInput("Be brief.", "Note the time.", tools=TOOLS, max_rounds=max_rounds)
    async with model(server.base_url, **kwargs) as llm:
        result = await run_planner_loop(inp, llm=llm)
    assert server.refusals == [], "the strict backend refused a request"
    assert server.pending == 0, "scripted replies were left over"
    return result


def tool_errors(result: PlannerLoopResult) -> list[str | None]:
    return [c.error for c in result.executed_calls]


# -- 1. tool-call ids that repeat across rounds ----------------------------------------------------


async def test_ids_repeating_across_rounds_are_unique_on_the_wire(server: FakeLLMServer) -> None:
    server.enqueue(json=reply(calls=[Call("clock_now", {}, id="clock_now:0")]))
    server.enqueue(json=reply(calls=[Call("clock_now", {}, id="clock_now:0")]))
    server.enqueue(json=reply("It is noon."))
    result = await run(server)
    assert result.stop_reason == "final_answer" and tool_errors(result) == [None, None]
    third = server.requests[2]["messages"]
    assert [c["id"] for m in third for c in m.get("tool_calls", [])] == [
        "clock_now:0",
        "clock_now:0-2",
    ]
    stored = [c.id for m in result.messages for c in m.tool_calls]
    assert stored == ["clock_now:0", "clock_now:0"]  # the log keeps the provider's ids


async def test_ids_repeating_inside_and_across_replies(server: FakeLLMServer) -> None:
    twice = [Call("clock_now", {}, id="call_0"), Call("save_note", {"title": "t"}, id="call_0")]
    server.enqueue(json=reply(calls=twice))
    server.enqueue(json=reply(calls=[Call("save_note", {"title": "u"}, id="call_0")]))
    server.enqueue(json=reply("Saved."))
    result = await run(server)
    assert result.stop_reason == "final_answer" and tool_errors(result) == [None, None, None]
    third = server.requests[2]["messages"]
    results = {m["tool_call_id"]: m["content"] for m in third if m["role"] == "tool"}
    assert results == {
        "call_0": '{"now": "12:00"}',
        "call_0-2": '{"id": 1}',
        "call_0-3": '{"id": 2}',
    }


# -- 2. errors inside a 200 ------------------------------------------------------------------------


async def test_a_429_inside_a_200_is_retried_like_a_429(server: FakeLLMServer) -> None:
    server.enqueue(json=error_in_200(429, "rate limited"))
    server.enqueue(json=reply("It is noon."))
    retries: list[tuple[int, str]] = []
    result = await run(server, on_retry=lambda n, reason: retries.append((n, reason)))
    assert result.stop_reason == "final_answer" and not result.failed
    assert retries == [(1, "http_429")]
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (error_in_200(429, "rate limited"), 429),
        (choice_error(502, "Provider returned error"), 502),  # OpenRouter, mid-answer
        ({"error": "upstream overloaded"}, 503),  # Ollama-style text
        ({"error": {"type": "rate_limit_error", "code": "rate_limit_exceeded"}}, 429),
        ([{"error": {"code": 503, "status": "UNAVAILABLE", "message": "busy"}}], 503),  # Gemini
        (error_in_200("500", "internal"), 500),
        ({"error": {"message": "something odd"}}, 502),  # no kind given: a failed upstream
        (reply("") | error_in_200(429.0, "slow down"), 429),  # an error wins over a choice
    ],
)
async def test_retryable_errors_inside_a_200_are_retried_then_reported(
    server: FakeLLMServer, body: Any, status: int
) -> None:
    server.enqueue(json=body)
    server.enqueue(json=body)
    result = await run(server, max_retries=1)
    assert result.stop_reason == "llm_error" and result.failed
    assert len(server.requests) == 2
    assert f"answered 200 with an error ({status}) after 2 attempts" in (result.error or "")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (error_in_200(400, "context too long"), 400, "context too long"),
        ({"object": "error", "message": "bad tool schema", "code": 400}, 400, "bad tool schema"),
        ({"error": {"code": "invalid_api_key", "message": "no such key"}}, 401, "no such key"),
        (choice_error(403, "moderation flagged the prompt"), 403, "moderation flagged"),
    ],
)
async def test_errors_inside_a_200_that_retrying_cannot_fix_fail_at_once(
    server: FakeLLMServer, body: Any, status: int, message: str
) -> None:
    server.enqueue(json=body)
    async with model(server.base_url) as llm:
        with pytest.raises(LLMStatusError) as info:
            await llm.complete(_request())
    assert info.value.status_code == status and message in str(info.value)
    assert len(server.requests) == 1


# -- 3. finish reasons -----------------------------------------------------------------------------


async def test_a_cut_answer_gets_one_more_round_with_a_note(server: FakeLLMServer) -> None:
    server.enqueue(json=reply("Steps: 1. Read the notes 2. Call the", finish_reason="length"))
    server.enqueue(json=reply("Done: noted the time."))
    result = await run(server)
    assert (result.stop_reason, result.final_answer) == ("final_answer", "Done: noted the time.")
    assert server.requests[1]["messages"][-1] == {"role": "user", "content": TRUNCATED_NOTE}


@pytest.mark.parametrize(
    ("body", "stop_reason", "error"),
    [
        (reply("Steps: 1. Read", finish_reason="length"), "truncated", "cut off"),
        (reply("Steps: 1. Read", finish_reason="MAX_TOKENS"), "truncated", "cut off"),
        (reply(None, finish_reason="content_filter"), "content_filtered", "filtered"),
        (reply(None, finish_reason="SAFETY"), "content_filtered", "filtered"),  # Gemini's name
        (
            reply(None, message_extra={"refusal": "I can't help with that."}),
            "content_filtered",
            "filtered",
        ),
        (reply(None, finish_reason="stop"), "empty_answer", "no text and no tool calls"),
        (reply("\n\n", finish_reason="stop"), "empty_answer", "no text and no tool calls"),
        (reply("", finish_reason=None), "empty_answer", "no text and no tool calls"),
        # a proxy that lost the tool calls on the way (it still says it had some)
        (reply("Let me check.", finish_reason="tool_calls"), "llm_error", "sent none"),
        # a reasoning model whose answer is only its thinking (Ollama, vLLM without a parser)
        (reply("<think>\nI need the clock.\n</think>\n\n"), "empty_answer", "no text"),
        (reply("<THINK>never closed"), "empty_answer", "no text"),
    ],
)
async def test_no_cut_filtered_empty_or_lost_answer_is_a_success(
    server: FakeLLMServer, body: dict[str, Any], stop_reason: str, error: str
) -> None:
    server.enqueue(json=body)
    result = await run(server, max_rounds=1)
    assert result.stop_reason == stop_reason and result.failed
    assert error in (result.error or "") and result.final_answer is None


async def test_tool_call_json_cut_by_length_tells_the_model_and_keeps_the_raw_text(
    server: FakeLLMServer,
) -> None:
    server.enqueue(
        json=reply(calls=[Call("save_note", '{"title": "Meeting no')], finish_reason="length")
    )
    server.enqueue(json=reply(calls=[Call("save_note", {"title": "Meeting notes"})]))
    server.enqueue(json=reply("Saved."))
    result = await run(server)
    assert result.stop_reason == "final_answer"
    first, second = result.executed_calls
    assert first.error is not None and "cut off at the output-token limit" in first.error
    assert first.call.raw_arguments == '{"title": "Meeting no'
    assert second.ok and saved == [{"title": "Meeting notes"}]
    sent = server.requests[1]["messages"][-1]
    assert "cut off at the output-token limit" in json.loads(sent["content"])["error"]
    stored = result.messages[2].to_json()["tool_calls"][0]
    assert stored["raw_arguments"] == '{"title": "Meeting no'


# -- 4. fields that must go back -------------------------------------------------------------------


async def test_deepseek_reasoning_content_goes_back_with_its_tool_calls() -> None:
    checks = [*STRICT, requires_assistant_field("reasoning_content")]
    with FakeLLMServer(checks=checks) as server:
        server.enqueue(
            json=reply(
                calls=[("clock_now", {})],
                message_extra={"reasoning_content": "The user wants the time; call clock_now."},
            )
        )
        server.enqueue(json=reply("It is noon."))
        result = await run(server)
    assert result.stop_reason == "final_answer"
    sent = server.requests[1]["messages"][2]
    assert sent["reasoning_content"] == "The user wants the time; call clock_now."
    stored = result.messages[2]
    assert stored.provider_fields == {
        "reasoning_content": "The user wants the time; call clock_now."
    }


async def test_gemini_thought_signatures_and_openrouter_reasoning_go_back(
    server: FakeLLMServer,
) -> None:
    signature = {"google": {"thought_signature": "CiQBcsjafQ=="}}
    details = [{"type": "reasoning.encrypted", "data": "gAAAA"}]
    server.enqueue(
        json=reply(
            calls=[Call("clock_now", {}, extra={"extra_content": signature})],
            message_extra={"reasoning_details": details, "annotations": [], "refusal": None},
        )
    )
    server.enqueue(json=reply("It is noon."))
    await run(server)
    sent = server.requests[1]["messages"][2]
    assert sent["tool_calls"][0]["extra_content"] == signature
    assert sent["reasoning_details"] == details
    assert "annotations" not in sent and "refusal" not in sent  # response-only or empty


# -- 5. arguments in odd encodings -----------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        '"{\\"title\\": \\"time\\"}"',  # the example: JSON text of JSON text
        json.dumps(json.dumps(json.dumps({"title": "time"}))),
        "{'title': 'time'}",
        '```json\n{"title": "time"}\n```',
        {"title": "time"},  # an object, not text
    ],
)
async def test_odd_argument_encodings_are_decoded_and_the_tool_runs(
    server: FakeLLMServer, arguments: Any
) -> None:
    server.enqueue(json=_raw_arguments_reply("save_note", arguments))
    server.enqueue(json=reply("Saved."))
    result = await run(server)
    assert tool_errors(result) == [None] and saved == [{"title": "time"}]
    assert json.loads(
        server.requests[1]["messages"][2]["tool_calls"][0]["function"]["arguments"]
    ) == {"title": "time"}


@pytest.mark.parametrize("arguments", ["", "null", "None", "{}", None, "  "])
async def test_no_arguments_in_any_spelling_for_a_tool_without_parameters(
    server: FakeLLMServer, arguments: Any
) -> None:
    server.enqueue(json=_raw_arguments_reply("clock_now", arguments))
    server.enqueue(json=reply("It is noon."))
    result = await run(server)
    assert tool_errors(result) == [None]


# -- 6. usage that is missing or partial -----------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "prompt", "completion", "estimated"),
    [
        ({"total_tokens": 42}, None, None, False),  # total alone counts in full
        ({"prompt_tokens": 30}, 30, None, True),  # the rest estimated
        ({"input_tokens": 30, "output_tokens": 7}, 30, 7, False),  # Anthropic's names
        ({"prompt_tokens": "30", "completion_tokens": 7.0}, 30, 7, False),
        ({"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 50}, 30, 20, False),
        (None, None, None, True),  # nothing: estimated
        # all zeros for a reply with text: placeholders, estimated
        ({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, None, None, True),
    ],
)
async def test_usage_counts_what_the_reply_gives_and_estimates_the_rest(
    server: FakeLLMServer,
    usage: dict[str, Any] | None,
    prompt: int | None,
    completion: int | None,
    estimated: bool,
) -> None:
    server.enqueue(json=reply("It is noon, and a fine day for it.", usage=usage))
    result = await run(server)
    got = result.usage
    assert got.estimated is estimated
    assert got.total_tokens > 0
    if usage and usage.get("total_tokens"):
        assert got.total_tokens == usage["total_tokens"]
    if prompt is not None:
        assert got.prompt_tokens == prompt
    if completion is not None:
        assert got.completion_tokens == completion
    stored = result.messages[-1].reply_info
    assert stored is not None and stored.usage == got


async def test_usage_billed_on_unusable_replies_is_kept(server: FakeLLMServer) -> None:
    billed = {"prompt_tokens": 100, "completion_tokens": 0, "total_tokens": 100}
    server.enqueue(json=error_in_200(503, "overloaded") | {"usage": billed})
    server.enqueue(json=reply("It is noon.", usage={"prompt_tokens": 100, "completion_tokens": 4}))
    result = await run(server)
    assert result.usage.total_tokens == 204  # the failed attempt was billed too

    server.enqueue(json={"choices": [], "usage": billed})
    result = await run(server)
    assert result.stop_reason == "llm_error" and result.usage.total_tokens == 100


# -- 7. a body that trickles -----------------------------------------------------------------------


async def test_a_trickling_body_hits_the_overall_deadline(server: FakeLLMServer) -> None:
    # ~300 bytes at 0.05 s each would take 15 s; every read is quick, only the total is late
    # (a deadline of 2 s, not less: a loaded machine must not make the quick reads late)
    server.enqueue(json=reply("It is noon."), trickle_s=0.05)
    async with model(server.base_url, timeout_s=2, max_retries=0) as llm:
        with pytest.raises(LLMConnectionError) as info:
            await llm.complete(_request())
    assert "did not answer within 2 s (after 1 attempt)" in str(info.value)
    assert "the whole answer had not arrived by the deadline" in str(info.value)


async def test_each_attempt_has_the_deadline_and_a_retry_can_succeed(
    server: FakeLLMServer,
) -> None:
    server.enqueue(json=reply("slow"), trickle_s=0.05)
    server.enqueue(json=reply("It is noon."))
    retries: list[tuple[int, str]] = []
    result = await run(  # 2 s: the quick reply must beat it however loaded the machine is
        server, timeout_s=2, max_retries=1, on_retry=lambda n, r: retries.append((n, r))
    )
    assert result.final_answer == "It is noon." and retries == [(1, "timeout")]


# -- 8. tool names the model invents ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "on_the_wire"),
    [
        ("multi_tool_use.parallel", "multi_tool_use_parallel"),  # the example
        ("functions.clock_now", "functions_clock_now"),
        ("clock now", "invalid_clock_now"),
        ("", "invalid_tool_name"),
    ],
)
async def test_invented_tool_names_get_an_error_and_a_valid_name_on_the_wire(
    server: FakeLLMServer, name: str, on_the_wire: str
) -> None:
    server.enqueue(json=reply(calls=[Call(name, {"tool_uses": []})]))
    server.enqueue(json=reply("Sorry, it is noon."))
    result = await run(server)
    assert result.stop_reason == "final_answer"
    [error] = tool_errors(result)
    assert error is not None and f"unknown tool {name!r}" in error
    sent = server.requests[1]["messages"][2]["tool_calls"][0]["function"]["name"]
    assert sent == on_the_wire
    assert result.messages[2].tool_calls[0].name == name  # the log keeps what the model said


# -- schema dialects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{"schema_dialect": "gemini"}, {"strip_schema_keywords": ["additionalProperties"]}],
)
async def test_schema_keywords_an_endpoint_refuses_can_be_left_out(options: dict[str, Any]) -> None:
    with FakeLLMServer(checks=[refuses_schema_keywords("additionalProperties")]) as server:
        async with model(server.base_url) as llm:
            with pytest.raises(LLMStatusError, match="Unknown name"):
                await llm.complete(_request())
        server.refusals.clear()
        server.enqueue(json=reply("It is noon."))
        result = await run(server, **options)
    assert result.final_answer == "It is noon."
    sent = server.requests[-1]["tools"][1]["function"]["parameters"]
    assert sent["required"] == ["title"] and "additionalProperties" not in sent


# -- the fallback endpoint -------------------------------------------------------------------------


async def test_the_fallback_answers_when_the_primary_stays_down(server: FakeLLMServer) -> None:
    server.enqueue(json=reply(calls=[("clock_now", {})]))
    server.enqueue(json=reply("It is noon."))
    primary = model(down_base_url(), max_retries=1, backoff_initial_s=0.001)
    fallback = model(server.base_url, name="fallback")
    inp = PlannerLoopInput("Be brief.", "Time?", tools=TOOLS, model="big-model")
    async with FallbackChatModel(primary, fallback, fallback_model="small-model") as llm:
        result = await run_planner_loop(inp, llm=llm)
    assert result.stop_reason == "final_answer"
    endpoints = [m.reply_info.endpoint for m in result.messages if m.reply_info is not None]
    assert endpoints == ["fallback", "fallback"]
    assert [r["model"] for r in server.requests] == ["small-model", "small-model"]


async def test_an_error_retrying_cannot_fix_goes_to_the_fallback_at_once() -> None:
    with FakeLLMServer() as primary_server, FakeLLMServer(checks=STRICT) as fallback_server:
        primary_server.enqueue(status=401, json={"error": {"message": "invalid api key"}})
        fallback_server.enqueue(json=reply("It is noon."))
        async with FallbackChatModel(
            model(primary_server.base_url), model(fallback_server.base_url, name="fallback")
        ) as llm:
            result = await run_planner_loop(PlannerLoopInput("Be brief.", "Time?"), llm=llm)
    assert len(primary_server.requests) == 1  # a 401 is not retried
    assert result.final_answer == "It is noon."
    assert result.messages[-1].reply_info is not None
    assert result.messages[-1].reply_info.endpoint == "fallback"


def _refuses_reasoning_content(body: dict[str, Any]) -> str | None:
    for i, message in enumerate(body.get("messages", [])):
        if "reasoning_content" in message:
            return f"messages[{i}]: Additional properties are not allowed ('reasoning_content')"
    return None


async def test_each_round_records_its_endpoint_and_fields_stay_with_their_endpoint() -> None:
    with (
        FakeLLMServer(checks=STRICT) as primary_server,
        FakeLLMServer(checks=[*STRICT, _refuses_reasoning_content]) as fallback_server,
    ):
        primary_server.enqueue(
            json=reply(calls=[("clock_now", {})], message_extra={"reasoning_content": "hm"})
        )
        primary_server.enqueue(status=500, json={"error": {"message": "overloaded"}})
        fallback_server.enqueue(json=reply("It is noon."))
        async with FallbackChatModel(
            model(primary_server.base_url, max_retries=0),
            model(fallback_server.base_url, name="fallback"),
        ) as llm:
            result = await run_planner_loop(
                PlannerLoopInput("Be brief.", "Time?", tools=TOOLS), llm=llm
            )
    assert fallback_server.refusals == []
    assert result.final_answer == "It is noon."
    endpoints = [m.reply_info.endpoint for m in result.messages if m.reply_info is not None]
    assert endpoints == ["primary", "fallback"]


def _request() -> Any:
    from planner import CompletionRequest

    return CompletionRequest(
        messages=[ChatMessage(role="user", content="Time?")],
        tools=[spec.to_openai_tool() for spec in TOOLS],
    )


def _raw_arguments_reply(name: str, arguments: Any) -> dict[str, Any]:
    body = reply(calls=[Call(name, {})])
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    return body


# -- tool calls in shapes other than message.tool_calls --------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        # Hermes / Qwen templates without a tool-call parser: the call is in the text
        reply('<tool_call>\n{"name": "clock_now", "arguments": {}}\n</tool_call>'),
        reply('Let me look.<tool_call>{"name": "clock_now", "parameters": {}}</tool_call>'),
        # the legacy function-calling shape: message.function_call, no id
        reply(
            None,
            finish_reason="function_call",
            message_extra={"function_call": {"name": "clock_now", "arguments": "{}"}},
        ),
    ],
)
async def test_tool_calls_written_in_other_shapes_run(
    server: FakeLLMServer, body: dict[str, Any]
) -> None:
    server.enqueue(json=body)
    server.enqueue(json=reply("It is noon."))
    result = await run(server)
    assert [c.call.name for c in result.executed_calls] == ["clock_now"]
    assert result.executed_calls[0].ok and result.stop_reason == "final_answer"


async def test_a_text_tool_call_block_that_is_no_call_stays_text(server: FakeLLMServer) -> None:
    server.enqueue(json=reply("Use <tool_call>like this</tool_call> to call tools."))
    result = await run(server, max_rounds=1)
    assert result.stop_reason == "final_answer" and result.executed_calls == []
    assert "<tool_call>like this</tool_call>" in (result.final_answer or "")
