"""Durable iterations in the planner: write calls are journaled around their handler with an
idempotency key, and a resumed loop goes on from a checkpoint without running settled calls
again."""

from __future__ import annotations

from typing import Any

import pytest

from planner import (
    CallFinished,
    CallStarted,
    ChatMessage,
    Checkpoint,
    ExecutedCall,
    PlannerLoopInput,
    ReplyInfo,
    RoundEnded,
    RunEvent,
    RunInterrupted,
    RunLog,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.compaction import estimate_message_tokens
from planner.testing import RecordingSink, ScriptedChatModel, final_answer, tool_calls
from worker.run.resume import context_at_checkpoint
from worker.store.records import StartedIteration

ran: list[tuple[str, str | None]] = []


async def _write(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append(("save", ctx.idempotency_key))
    return "saved"


async def _read(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append(("look", ctx.idempotency_key))
    return "looked"


SAVE = ToolSpec("save", "Save.", {"type": "object"}, "write", _write)
LOOK = ToolSpec("look", "Look.", {"type": "object"}, "read", _read)
CTX = ToolContext(user_id="u1", iteration_id=42)


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def inp(**kw: Any) -> PlannerLoopInput:
    base: dict[str, Any] = {
        "system_prompt": "sys",
        "user_prompt": "go",
        "tools": [SAVE, LOOK],
        "ctx": CTX,
        "max_rounds": 4,
    }
    return PlannerLoopInput(**(base | kw))


async def test_writes_start_with_a_stable_key_and_reads_without_one() -> None:
    sink = RecordingSink()
    llm = ScriptedChatModel(
        [tool_calls(("look", {}), ("save", {}), ("save", {})), final_answer("ok")]
    )
    result = await run_planner_loop(inp(), llm=llm, sink=sink)
    llm.assert_exhausted()
    assert result.stop_reason == "final_answer"
    assert [
        (e.round, e.position, e.hint, e.idempotency_key) for e in sink.of_type(CallStarted)
    ] == [
        (1, 0, "read", None),
        (1, 1, "write", "42:1:1"),
        (1, 2, "write", "42:1:2"),
    ]
    assert [e.executed.index for e in sink.of_type(CallFinished)] == [0, 1, 2]
    assert ran == [("look", None), ("save", "42:1:1"), ("save", "42:1:2")]


async def test_a_write_whose_start_cannot_be_recorded_does_not_run() -> None:
    sink = RecordingSink()
    sink.fail_start_with = ConnectionError("database down")
    llm = ScriptedChatModel([tool_calls(("save", {})), final_answer("ok")])
    result = await run_planner_loop(inp(), llm=llm, sink=sink)
    llm.assert_exhausted()
    [executed] = result.executed_calls
    assert ran == [] and not executed.ran
    assert executed.error == "save was not run: its start could not be recorded"


async def test_a_write_whose_journal_is_unreachable_stops_the_run_untold() -> None:
    sink = RecordingSink()
    sink.fail_start_with = RunInterrupted("the journal's database did not answer")
    llm = ScriptedChatModel([tool_calls(("save", {}))])
    with pytest.raises(RunInterrupted):
        await run_planner_loop(inp(), llm=llm, sink=sink)
    llm.assert_exhausted()
    assert ran == [] and sink.of_type(CallFinished) == []  # the model read nothing about it


async def test_a_round_ends_once_its_results_are_in_the_log() -> None:
    seen: list[tuple[int, int, int]] = []
    log = RunLog()

    async def sink(event: RunEvent) -> None:
        log.apply(event)
        if isinstance(event, RoundEnded):
            seen.append(
                (event.round, len(event.calls), sum(m.role == "tool" for m in log.messages))
            )

    llm = ScriptedChatModel(
        [tool_calls(("look", {})), tool_calls(("save", {}), ("look", {})), final_answer("ok")]
    )
    await run_planner_loop(inp(), llm=llm, sink=sink)
    llm.assert_exhausted()
    assert seen == [(1, 1, 1), (2, 2, 3)]


def assistant(*calls: tuple[str, str]) -> ChatMessage:
    return ChatMessage(role="assistant", tool_calls=tuple(ToolCall(id=i, name=n) for n, i in calls))


HEAD = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="go")]


async def test_a_resumed_loop_settles_the_pending_round_then_goes_on() -> None:
    round_1 = [
        assistant(("save", "c1")),
        ChatMessage(role="tool", content="saved", tool_call_id="c1"),
    ]
    pending = assistant(("save", "c2"), ("look", "c3"), ("save", "c4"))
    unknown = ExecutedCall(2, pending.tool_calls[0], None, "outcome unknown", index=0, ran=True)
    checkpoint = Checkpoint(
        messages=[*HEAD, *round_1, pending],
        rounds_done=2,
        usage=TokenUsage(prompt_tokens=100, completion_tokens=10),
        settled={0: unknown},
    )
    llm = ScriptedChatModel([final_answer("done")])
    result = await run_planner_loop(inp(resume=checkpoint), llm=llm)

    # the unknown write is not run again; the read is run; the write that never started runs
    assert ran == [("look", None), ("save", "42:2:2")]
    assert result.stop_reason == "final_answer" and result.rounds == 3
    assert result.usage == TokenUsage(prompt_tokens=110, completion_tokens=15)
    tool_results = [m for m in result.messages if m.role == "tool"]
    assert [m.tool_call_id for m in tool_results] == ["c1", "c2", "c3", "c4"]
    assert "outcome unknown" in (tool_results[1].content or "")
    assert [c.index for c in result.executed_calls] == [0, 1, 2]
    # the model's next request holds the whole conversation, the resumed part included
    assert [m.role for m in llm.requests[0].messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "tool",
    ]


async def test_a_resume_past_the_last_round_only_settles() -> None:
    pending = assistant(("look", "c1"))
    checkpoint = Checkpoint(messages=[*HEAD, pending], rounds_done=4)
    result = await run_planner_loop(inp(resume=checkpoint), llm=ScriptedChatModel([]))
    assert result.stop_reason == "max_rounds" and result.rounds == 4
    assert ran == [("look", None)]


async def test_a_resume_after_a_complete_round_asks_the_model_next() -> None:
    done = [assistant(("look", "c1")), ChatMessage(role="tool", content="x", tool_call_id="c1")]
    checkpoint = Checkpoint(messages=[*HEAD, *done], rounds_done=1)
    llm = ScriptedChatModel([final_answer("done")])
    result = await run_planner_loop(inp(resume=checkpoint), llm=llm)
    assert ran == [] and result.rounds == 2 and result.final_answer == "done"


def test_a_takeover_counts_the_context_as_the_earlier_attempt_did() -> None:
    reply = ChatMessage(
        role="assistant",
        tool_calls=(ToolCall(id="c1", name="clock_now"),),
        reply_info=ReplyInfo(usage=TokenUsage(prompt_tokens=900, completion_tokens=20)),
    )
    result = ChatMessage(role="tool", content="x" * 400, tool_call_id="c1")
    log = [
        ChatMessage(role="system", content="s"),
        ChatMessage(role="user", content="u"),
        reply,
        result,
    ]
    started = StartedIteration(id=1, attempt=2, rounds=1)
    # the provider's count of the last request and answer, plus the result appended since
    assert context_at_checkpoint(log, started) == 920 + estimate_message_tokens(result)
    # a compaction after that reply (before round 2): the count it left
    after = StartedIteration(id=1, attempt=2, rounds=1, last_compaction=(2, 300))
    assert context_at_checkpoint(log, after) == 300
    # no usable count from the provider: the loop estimates
    unreported = reply.model_copy(update={"reply_info": ReplyInfo()})
    assert context_at_checkpoint([*log[:2], unreported, result], started) is None
