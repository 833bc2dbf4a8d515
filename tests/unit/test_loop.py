"""The planner loop with the scripted model: rounds, stop reasons, tool results, reminders."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planner import (
    CallFinished,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    LLMStatusError,
    LoopState,
    PlannerLoopInput,
    PolicyDecision,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolRegistryError,
    ToolSpec,
    record_of,
    run_planner_loop,
)
from planner.gate import RulePolicyGate
from planner.policy import PolicyConfig, UserPolicySettings
from planner.testing import (
    InMemoryCallLedger,
    RecordingSink,
    ScriptedChatModel,
    ScriptExhaustedError,
    final_answer,
    tool_calls,
)
from reminders import policy_feedback_reminder


async def _echo(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"echo": args["text"], "user": ctx.user_id}


async def _boom(args: dict[str, Any], ctx: ToolContext) -> None:
    raise RuntimeError("disk on fire")


ECHO = ToolSpec(
    name="echo",
    description="Echo text back.",
    input_schema={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    policy_hint="read",
    handler=_echo,
)
BOOM = ToolSpec(
    name="boom",
    description="Always fails.",
    input_schema={"type": "object", "properties": {}},
    policy_hint="write",
    handler=_boom,
)


def _inp(**kw: Any) -> PlannerLoopInput:
    base: dict[str, Any] = {
        "system_prompt": "You are helpful.",
        "user_prompt": "Do the thing.",
        "tools": [ECHO, BOOM],
        "ctx": ToolContext(user_id="u1"),
    }
    return PlannerLoopInput(**(base | kw))


def _tool_results(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [json.loads(m.content or "null") for m in messages if m.role == "tool"]


async def test_final_answer_without_tools_stops_after_one_round() -> None:
    llm = ScriptedChatModel([final_answer("done")])
    result = await run_planner_loop(_inp(), llm=llm)
    assert result.stop_reason == "final_answer"
    assert result.rounds == 1
    assert result.final_answer == "done"
    assert [m.role for m in result.messages] == ["system", "user", "assistant"]
    llm.assert_exhausted()


async def test_tool_round_then_answer_records_calls_and_sums_usage() -> None:
    llm = ScriptedChatModel(
        [
            tool_calls(
                ("echo", {"text": "hi"}), usage=TokenUsage(prompt_tokens=7, completion_tokens=3)
            ),
            final_answer("said hi", usage=TokenUsage(prompt_tokens=11, completion_tokens=2)),
        ]
    )
    result = await run_planner_loop(_inp(), llm=llm)
    assert result.stop_reason == "final_answer"
    assert result.rounds == 2
    assert result.usage == TokenUsage(prompt_tokens=18, completion_tokens=5)
    assert result.usage.total_tokens == 23
    [call] = result.executed_calls
    assert call.ok and call.round == 1 and call.result == {"echo": "hi", "user": "u1"}
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]
    # the second request carries the tool result answering the first call's id
    second = llm.requests[1].messages
    assert second[3].role == "tool" and second[3].tool_call_id == second[2].tool_calls[0].id


async def test_max_rounds_stops_a_model_that_keeps_calling_tools() -> None:
    llm = ScriptedChatModel([tool_calls(("echo", {"text": str(i)})) for i in range(3)])
    result = await run_planner_loop(_inp(max_rounds=3), llm=llm)
    assert result.stop_reason == "max_rounds"
    assert result.rounds == 3
    assert len(result.executed_calls) == 3
    assert result.messages[-1].role == "tool"  # the last call still got its result


@pytest.mark.parametrize(
    ("call", "expected_error"),
    [
        (ToolCall(id="c1", name="nope", arguments={}), "unknown tool 'nope'"),
        (ToolCall(id="c1", name="echo", arguments={"text": 5}), "invalid arguments for echo"),
        (ToolCall(id="c1", name="echo", arguments={}), "'text' is a required property"),
        (
            ToolCall(id="c1", name="echo", arguments={}, parse_error="Expecting value"),
            "could not parse the arguments for echo: Expecting value",
        ),
        (ToolCall(id="c1", name="boom", arguments={}), "boom failed: disk on fire"),
    ],
)
async def test_bad_tool_calls_become_error_results_the_model_reads(
    call: ToolCall, expected_error: str
) -> None:
    from planner import CompletionResponse

    llm = ScriptedChatModel(
        [
            CompletionResponse(message=ChatMessage(role="assistant", tool_calls=(call,))),
            final_answer("ok, giving up"),
        ]
    )
    result = await run_planner_loop(_inp(), llm=llm)
    assert result.stop_reason == "final_answer"
    [executed] = result.executed_calls
    assert executed.error is not None and expected_error in executed.error
    [tool_msg] = [m for m in result.messages if m.role == "tool"]
    assert tool_msg.tool_call_id == "c1"
    assert expected_error in json.loads(tool_msg.content or "{}")["error"]


async def test_every_call_gets_exactly_one_result_in_issue_order() -> None:
    llm = ScriptedChatModel(
        [
            tool_calls(
                ("echo", {"text": "a"}), ("nope", {}), ("boom", {}), ("echo", {"text": "b"})
            ),
            final_answer("done"),
        ]
    )
    result = await run_planner_loop(_inp(), llm=llm)
    assistant = result.messages[2]
    results = [m for m in result.messages if m.role == "tool"]
    assert [m.tool_call_id for m in results] == [c.id for c in assistant.tool_calls]
    assert [e.ok for e in result.executed_calls] == [True, False, False, True]
    assert _tool_results(result.messages)[3] == {"echo": "b", "user": "u1"}


async def test_llm_error_ends_the_loop_and_keeps_the_log() -> None:
    llm = ScriptedChatModel(
        [
            tool_calls(("echo", {"text": "a"})),
            LLMStatusError("endpoint answered 503", status_code=503, body=""),
        ]
    )
    result = await run_planner_loop(_inp(), llm=llm)
    assert result.stop_reason == "llm_error"
    assert result.error == "endpoint answered 503"
    assert result.rounds == 2
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "tool"]


async def test_reminders_reach_the_request_but_never_the_stored_log() -> None:
    seen: list[LoopState] = []

    def channel(state: LoopState) -> list[str]:
        seen.append(state)
        return [f"round {state.round} of {state.max_rounds}"]

    llm = ScriptedChatModel([tool_calls(("echo", {"text": "a"})), final_answer("done")])
    result = await run_planner_loop(_inp(reminder_channel=channel), llm=llm)
    first, second = llm.requests
    assert first.messages[-1] == ChatMessage(
        role="system", content="<reminder>round 1 of 5</reminder>"
    )
    assert second.messages[-1].content == "<reminder>round 2 of 5</reminder>"
    # only one reminder per request: the first one is not carried into the second
    assert sum("<reminder>" in (m.content or "") for m in second.messages) == 1
    assert all("<reminder>" not in (m.content or "") for m in result.messages)
    assert [s.round for s in seen] == [1, 2]
    assert seen[1].tool_call_count == 1 and seen[1].last_call is not None


async def test_policy_denial_skips_the_handler_and_tells_the_model() -> None:
    ran: list[str] = []

    async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append("ran")
        return "deleted"

    delete = ToolSpec("delete_all", "Delete.", {"type": "object"}, "destructive", handler)

    async def gate(spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        return PolicyDecision(allow=spec.policy_hint != "destructive", reason="not opted in")

    llm = ScriptedChatModel([tool_calls(("delete_all", {})), final_answer("ok")])
    result = await run_planner_loop(_inp(tools=[delete], policy=gate), llm=llm)
    assert ran == []
    [executed] = result.executed_calls
    assert executed.decision is not None and not executed.decision.allow
    assert "denied by policy: not opted in" in (executed.error or "")


async def test_enforced_denial_reaches_the_model_as_a_result_and_a_one_time_reminder() -> None:
    ran: list[dict[str, Any]] = []

    async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(args)
        return "deleted"

    delete = ToolSpec(
        "notes_delete", "Delete.", {"type": "object"}, "destructive", handler, "notes"
    )
    gate = RulePolicyGate(
        mode="enforce",
        config=PolicyConfig(),
        user_settings=UserPolicySettings(),
        ledger=InMemoryCallLedger(),
    )
    llm = ScriptedChatModel(
        [
            tool_calls(("notes_delete", {"id": 1}), ("echo", {"text": "hi"})),
            tool_calls(("echo", {"text": "again"})),
            final_answer("could not delete"),
        ]
    )
    channel = lambda state: [r for r in [policy_feedback_reminder(state)] if r]  # noqa: E731
    result = await run_planner_loop(
        _inp(tools=[delete, ECHO], policy=gate, reminder_channel=channel), llm=llm
    )
    assert ran == [] and result.stop_reason == "final_answer"
    denied, echoed, _ = result.executed_calls
    assert denied.decision is not None and denied.decision.reason == "destructive_not_opted_in"
    assert (denied.error or "").startswith("denied by policy (destructive_not_opted_in): ")
    assert _tool_results(result.messages)[0] == {"error": denied.error}
    assert echoed.ok and echoed.decision is not None and echoed.decision.allow
    # the next request (round 2) carries the decision's reminder; round 3 no longer does
    second, third = llm.requests[1].messages, llm.requests[2].messages
    assert second[-1].content == f"<reminder>{denied.decision.reminder}</reminder>"
    assert not any("<reminder>" in (m.content or "") for m in third)
    assert not any("<reminder>" in (m.content or "") for m in result.messages)


async def test_on_tool_call_executes_instead_of_the_handler() -> None:
    async def remote(call: ToolCall) -> str:
        return f"remote:{call.arguments['text']}"

    llm = ScriptedChatModel([tool_calls(("echo", {"text": "x"})), final_answer("ok")])
    result = await run_planner_loop(_inp(), llm=llm, on_tool_call=remote)
    assert result.executed_calls[0].result == "remote:x"
    assert result.messages[3].content == "remote:x"


async def test_prior_messages_sit_between_system_and_user() -> None:
    prior = [
        ChatMessage(role="user", content="earlier"),
        ChatMessage(role="assistant", content="ok"),
    ]
    llm = ScriptedChatModel([final_answer("done")])
    await run_planner_loop(_inp(prior_messages=prior), llm=llm)
    sent = llm.requests[0].messages
    assert [m.content for m in sent[:4]] == ["You are helpful.", "earlier", "ok", "Do the thing."]
    assert sent[0].role == "system"


async def test_request_carries_tools_in_openai_format_and_model() -> None:
    llm = ScriptedChatModel([final_answer("done")])
    await run_planner_loop(_inp(model="m-1"), llm=llm)
    request: CompletionRequest = llm.requests[0]
    assert request.model == "m-1"
    assert [t["function"]["name"] for t in request.tools] == ["echo", "boom"]
    assert request.tools[0]["function"]["parameters"] == ECHO.input_schema


async def test_scripted_model_fails_loudly_when_asked_for_more() -> None:
    llm = ScriptedChatModel([tool_calls(("echo", {"text": "a"}))])
    with pytest.raises(ScriptExhaustedError):
        await run_planner_loop(_inp(), llm=llm)


def test_scripted_model_reports_unused_steps() -> None:
    llm = ScriptedChatModel([final_answer("never asked")])
    with pytest.raises(AssertionError, match="1 scripted step"):
        llm.assert_exhausted()
    llm.unused_ok = True  # a test stopping a run early says so, and the leftover passes
    llm.assert_exhausted()


def test_max_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_rounds must be >= 1"):
        _inp(max_rounds=0)


@pytest.mark.parametrize(
    ("name", "schema", "message"),
    [
        ("bad name!", {"type": "object"}, "invalid tool name"),
        ("ok", {"type": "not-a-type"}, "invalid JSON schema for tool 'ok'"),
    ],
)
def test_a_tool_with_a_bad_name_or_schema_is_refused_at_construction(
    name: str, schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolRegistryError, match=message):
        ToolSpec(name, "x", schema, "read", _echo)


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ToolRegistryError, match="duplicate tool name 'echo'"):
        ToolRegistry([ECHO, ECHO])


async def test_the_sink_sees_every_event_and_its_fold_is_the_result() -> None:
    sink = RecordingSink()
    llm = ScriptedChatModel([tool_calls(("echo", {"text": "a"}), ("boom", {})), final_answer("ok")])
    result = await run_planner_loop(_inp(), llm=llm, sink=sink)
    llm.assert_exhausted()
    kinds = [type(e).__name__ for e in sink.events]
    assert kinds == [
        "RunStarted",
        "RequestSent",
        "ReplyJudged",
        "CallStarted",
        "CallFinished",
        "CallStarted",  # boom is a write: it runs alone, after the read
        "CallFinished",
        "RoundEnded",
        "RequestSent",
        "ReplyJudged",
        "RunStopped",
    ]
    assert [e.executed.call.name for e in sink.of_type(CallFinished)] == ["echo", "boom"]
    # the record folded from the events is the result: one count of everything
    assert sink.record == result.record
    assert list(sink.record.messages) == result.messages
    assert (sink.record.rounds, sink.record.usage) == (result.rounds, result.usage)
    assert record_of(sink.events) == result.record


async def test_a_round_without_calls_leaves_no_calls_to_the_next_rounds_state() -> None:
    seen: list[LoopState] = []

    def channel(state: LoopState) -> list[str]:
        seen.append(state)
        return []

    cut = CompletionResponse(
        message=ChatMessage(role="assistant", content="1. Re"), finish_reason="length"
    )
    llm = ScriptedChatModel([tool_calls(("echo", {"text": "a"})), cut, final_answer("done")])
    result = await run_planner_loop(_inp(reminder_channel=channel), llm=llm)
    assert result.stop_reason == "final_answer" and result.rounds == 3
    assert [len(s.last_round_calls) for s in seen] == [0, 1, 0]
