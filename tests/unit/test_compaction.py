"""Compaction: where it splits (never between a call and its result), what it keeps, that the
archive restores the conversation exactly, and how the loop uses it (once, then
``context_exhausted``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import (
    ChatMessage,
    Checkpoint,
    Compacted,
    CompactionFailed,
    Compactor,
    CompletionRequest,
    CompletionResponse,
    LLMConnectionError,
    PlannerLoopInput,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_planner_loop,
    should_compact,
)
from planner.compaction import (
    CompactionError,
    compact_history,
    estimate_message_tokens,
    estimate_tokens,
    restore,
    split_points,
)
from planner.testing import (
    FunctionChatModel,
    RecordingSink,
    ScriptedChatModel,
    final_answer,
    tool_calls,
)
from reminders import compacted_reminder

HEAD = [
    ChatMessage(role="system", content="You are careful."),
    ChatMessage(role="user", content="earlier question"),
    ChatMessage(role="assistant", content="earlier answer"),
    ChatMessage(role="user", content="Do the mission."),
]


def summariser(text: str = "Facts found: x. Decisions made: none.") -> FunctionChatModel:
    return FunctionChatModel(lambda request: final_answer(text))


# -- should_compact ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "max_ctx", "expected"),
    [(919, 1000, False), (920, 1000, True), (921, 1000, True), (10**9, 0, False)],
)
def test_should_compact_at_92_percent(tokens: int, max_ctx: int, expected: bool) -> None:
    assert should_compact(tokens, max_ctx) is expected


def test_the_threshold_is_a_parameter() -> None:
    assert should_compact(500, 1000, threshold=0.5) and not should_compact(499, 1000, 0.5)


# -- the split, property-based ----------------------------------------------------------------

_ids = iter(range(10**9))


@st.composite
def conversations(draw: st.DrawFn) -> list[ChatMessage]:
    """A head (system, prior turns, the objective), then turns: an assistant message with a
    batch of 0-4 tool calls (parallel reads) and their results, sometimes a note after it."""
    messages = [ChatMessage(role="system", content="sys")]
    for _ in range(draw(st.integers(0, 2))):
        messages += [
            ChatMessage(role="user", content="before"),
            ChatMessage(role="assistant", content="ok"),
        ]
    messages.append(ChatMessage(role="user", content="objective"))
    for _ in range(draw(st.integers(0, 12))):
        width = draw(st.integers(0, 4))
        calls = tuple(
            ToolCall(
                id=f"c{next(_ids)}", name="look", arguments={"q": "x" * draw(st.integers(0, 40))}
            )
            for _ in range(width)
        )
        text = "thinking " * draw(st.integers(0, 20)) if not calls or draw(st.booleans()) else None
        messages.append(ChatMessage(role="assistant", content=text, tool_calls=calls))
        for call in calls:
            size = draw(st.integers(0, 400))
            messages.append(ChatMessage(role="tool", content="r" * size, tool_call_id=call.id))
        if draw(st.integers(0, 5)) == 0:
            messages.append(ChatMessage(role="user", content="a note from the loop"))
    return messages


def assert_well_formed(messages: list[ChatMessage]) -> None:
    """Every tool message follows, in the same block, the assistant message that called it."""
    open_calls: set[str] = set()
    for message in messages:
        if message.role == "assistant":
            open_calls = {c.id for c in message.tool_calls}
        elif message.role == "tool":
            assert message.tool_call_id in open_calls, f"orphaned tool result {message}"
            open_calls.discard(message.tool_call_id or "")
        else:
            open_calls = set()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=conversations(), keep_recent=st.integers(0, 3000))
async def test_compaction_never_orphans_a_tool_result_keeps_the_head_and_restores_exactly(
    conversation: list[ChatMessage], keep_recent: int
) -> None:
    head = next(i + 1 for i, m in enumerate(conversation) if m.content == "objective")
    head_end, cuts = split_points(conversation, head)
    try:
        compaction = await compact_history(
            conversation, llm=summariser("s"), model=None, keep_recent=keep_recent, head=head
        )
    except CompactionError as exc:
        assert exc.reason in ("nothing_to_fold", "unusable_summary")
        return
    new = compaction.messages
    assert_well_formed(new)
    assert new[:head_end] == conversation[:head_end]  # the head is intact
    assert new[head_end].role == "user" and "<summary of" in (new[head_end].content or "")
    assert new[head_end + 1 :] == conversation[compaction.end :]  # the tail is verbatim
    assert compaction.end in cuts and compaction.start == head_end
    assert compaction.folded_turns >= 1
    assert restore(new, [(compaction.start, compaction.folded)]) == conversation


@given(conversation=conversations())
@settings(max_examples=100, deadline=None)
async def test_two_compactions_restore_in_reverse_order(conversation: list[ChatMessage]) -> None:
    try:
        first = await compact_history(conversation, llm=summariser("a"), model=None, keep_recent=0)
        grown = [
            *first.messages,
            ChatMessage(role="assistant", content="more"),
            ChatMessage(role="assistant", content="and more " * 30),
            ChatMessage(role="assistant", content="last"),
        ]
        second = await compact_history(grown, llm=summariser("b"), model=None, keep_recent=0)
    except CompactionError:
        return
    folds = [(first.start, first.folded), (second.start, second.folded)]
    assert restore(second.messages, folds) == [*conversation, *grown[len(first.messages) :]]


# -- what is kept, what the summariser reads -----------------------------------------------------


def turn(n: int, result_size: int = 200) -> list[ChatMessage]:
    call = ToolCall(id=f"t{n}", name="look", arguments={"n": n})
    return [
        ChatMessage(role="assistant", tool_calls=(call,)),
        ChatMessage(role="tool", content=f"result {n} " + "x" * result_size, tool_call_id=call.id),
    ]


async def test_the_recent_turns_within_the_budget_stay_verbatim() -> None:
    conversation = [*HEAD, *turn(1), *turn(2), *turn(3), *turn(4)]
    per_turn = sum(estimate_message_tokens(m) for m in turn(4))
    compaction = await compact_history(
        conversation, llm=summariser(), model="cheap", keep_recent=2 * per_turn, head=len(HEAD)
    )
    assert compaction.messages[len(HEAD) + 1 :] == [*turn(3), *turn(4)]
    assert compaction.folded == [*turn(1), *turn(2)] and compaction.folded_turns == 2
    assert compaction.tokens_after < compaction.tokens_before
    assert "2 earlier turn(s)" in (compaction.messages[len(HEAD)].content or "")


async def test_the_summariser_reads_the_middle_with_the_summary_prompt() -> None:
    seen: list[CompletionRequest] = []

    def record(request: CompletionRequest) -> CompletionResponse:
        seen.append(request)
        return final_answer("Facts found: results 1 and 2.")

    conversation = [*HEAD, *turn(1), *turn(2), *turn(3)]
    await compact_history(conversation, llm=FunctionChatModel(record), model="cheap", keep_recent=0)
    [request] = seen
    assert request.model == "cheap" and request.tools == []
    assert "Facts found" in (request.messages[0].content or "")
    text = request.messages[1].content or ""
    assert "result 1" in text and "result 2" in text and "result 3" not in text


async def test_a_middle_too_large_for_the_summariser_is_trimmed_oldest_first() -> None:
    seen: list[str] = []

    def record(request: CompletionRequest) -> CompletionResponse:
        seen.append(request.messages[1].content or "")
        return final_answer("short")

    conversation = [*HEAD, *(m for n in range(1, 30) for m in turn(n, 2000)), *turn(99)]
    await compact_history(
        conversation,
        llm=FunctionChatModel(record),
        model=None,
        keep_recent=0,
        max_input_tokens=3000,
    )
    assert "left out to fit" in seen[0] and "result 28" in seen[0] and "result 1 " not in seen[0]
    assert len(seen[0]) < 3000 * 4


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (LLMConnectionError("summariser down"), "llm_error"),
        (final_answer("   "), "unusable_summary"),
        (tool_calls(("look", {})), "unusable_summary"),
        (final_answer("y" * 100_000), "unusable_summary"),  # not shorter than what it folds
    ],
)
async def test_a_failed_or_useless_summary_compacts_nothing(answer: Any, reason: str) -> None:
    conversation = [*HEAD, *turn(1), *turn(2), *turn(3)]
    with pytest.raises(CompactionError) as caught:
        await compact_history(
            conversation, llm=ScriptedChatModel([answer]), model=None, keep_recent=0
        )
    assert caught.value.reason == reason


async def test_too_few_turns_is_nothing_to_fold() -> None:
    with pytest.raises(CompactionError) as caught:
        await compact_history(
            [*HEAD, *turn(1)], llm=summariser(), model=None, keep_recent=0, head=len(HEAD)
        )
    assert caught.value.reason == "nothing_to_fold"


# -- in the loop --------------------------------------------------------------------------------


async def _look(args: dict[str, Any], ctx: ToolContext) -> str:
    return "found " + "z" * 600


LOOK = ToolSpec("look", "Look.", {"type": "object"}, "read", _look)


def looping_model(rounds_then_answer: int = 99) -> FunctionChatModel:
    def answer(request: CompletionRequest) -> CompletionResponse:
        done = sum(m.role == "assistant" for m in request.messages)
        if done >= rounds_then_answer:
            return final_answer("done", usage=TokenUsage())
        return tool_calls(("look", {"n": done}), usage=TokenUsage())

    return FunctionChatModel(answer)


def loop_input(compactor: Compactor, **kw: Any) -> PlannerLoopInput:
    channel = lambda state: [r for r in [compacted_reminder(state)] if r]  # noqa: E731
    base: dict[str, Any] = {
        "system_prompt": "sys",
        "user_prompt": "go",
        "tools": [LOOK],
        "max_rounds": 40,
        "compactor": compactor,
        "reminder_channel": channel,
    }
    return PlannerLoopInput(**(base | kw))


async def test_the_loop_compacts_once_tells_the_model_then_stops_at_the_context() -> None:
    model = looping_model()
    sink = RecordingSink()
    compactor = Compactor(llm=summariser(), max_ctx=1500, keep_recent_tokens=200)
    result = await run_planner_loop(loop_input(compactor), llm=model, sink=sink)
    made = [(e.round, e.compaction) for e in sink.of_type(Compacted)]
    assert result.compactions_done == 1 and len(made) == 1
    round_no, compaction = made[0]
    # the request right after the compaction reads the summary, not the folded turns
    after = model.requests[round_no - 1].messages
    assert any("<summary of" in (m.content or "") for m in after)
    assert after[-1].content is not None and "summarised to fit the context" in after[-1].content
    assert not any("<reminder>" in (m.content or "") for m in result.messages)
    # crossing the threshold again ends the run instead of sending an over-long request
    assert result.stop_reason == "context_exhausted" and result.failed
    assert "after 1 compaction attempt(s)" in (result.error or "")
    restored = restore(result.messages, [(compaction.start, compaction.folded)])
    assert sum(m.role == "assistant" for m in restored) == result.rounds


async def test_a_failing_summariser_lets_the_run_go_on_then_ends_it_readably() -> None:
    sink = RecordingSink()
    broken = ScriptedChatModel([LLMConnectionError("summariser down")])
    compactor = Compactor(llm=broken, max_ctx=1500, keep_recent_tokens=200)
    result = await run_planner_loop(loop_input(compactor), llm=looping_model(), sink=sink)
    failures = [e.error.reason for e in sink.of_type(CompactionFailed)]
    assert failures == ["llm_error"] and result.compactions_done == 0
    assert result.compaction_errors and "summariser down" in result.compaction_errors[0]
    assert result.stop_reason == "context_exhausted"


async def test_a_context_that_never_fills_never_compacts() -> None:
    compactor = Compactor(llm=ScriptedChatModel([]), max_ctx=10**6)
    result = await run_planner_loop(loop_input(compactor), llm=looping_model(rounds_then_answer=3))
    assert result.stop_reason == "final_answer" and result.compactions_done == 0


async def test_the_providers_reported_usage_drives_the_count() -> None:
    def answer(request: CompletionRequest) -> CompletionResponse:
        done = sum(m.role == "assistant" for m in request.messages)
        if done >= 2:
            return final_answer("done")
        # the endpoint says the prompt was huge: the loop believes it over its estimate
        return tool_calls(("look", {}), usage=TokenUsage(prompt_tokens=1400, completion_tokens=5))

    compactor = Compactor(llm=summariser(), max_ctx=1500, keep_recent_tokens=10)
    result = await run_planner_loop(loop_input(compactor), llm=FunctionChatModel(answer))
    assert result.stop_reason == "context_exhausted"  # 1405 + results ≥ 92 % of 1500
    assert json.dumps(result.compaction_errors)  # nothing to fold after one turn: reported


async def test_an_endpoint_that_under_counts_its_prompt_is_still_compacted() -> None:
    """Endpoints with prompt caching report only the uncached part of the prompt
    (ollama/ollama#5370): the loop trusts the larger of that and its own estimate."""

    async def page(args: dict[str, Any], ctx: ToolContext) -> str:
        return "p" * 1200  # about 300 tokens a call

    def answer(request: CompletionRequest) -> CompletionResponse:
        done = sum(m.role == "assistant" for m in request.messages)
        if done >= 12:
            return final_answer("done", usage=TokenUsage(prompt_tokens=12, completion_tokens=2))
        return tool_calls(("page", {}), usage=TokenUsage(prompt_tokens=12, completion_tokens=5))

    model = FunctionChatModel(answer)
    tools = [ToolSpec("page", "A page.", {"type": "object"}, "read", page)]
    compactor = Compactor(llm=summariser(), max_ctx=2000, keep_recent_tokens=300)
    result = await run_planner_loop(loop_input(compactor, tools=tools), llm=model)
    assert result.compactions_done >= 1
    # no request went out past the context, whatever the endpoint reported
    sent = [sum(estimate_message_tokens(m) for m in r.messages) for r in model.requests]
    assert max(sent) < 2000


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            CompletionResponse(
                message=ChatMessage(role="assistant", content="Facts found: x. Decis"),
                finish_reason="length",
            ),
            "cut off at its token limit",
        ),
        (
            CompletionResponse(
                message=ChatMessage(role="assistant", content="Facts"),
                finish_reason="content_filter",
            ),
            "filtered",
        ),
        (final_answer("<think>the turns say x</think>  "), "no summary text"),
    ],
    ids=["cut-off", "filtered", "reasoning-only"],
)
async def test_a_summary_a_mission_reply_would_refuse_is_unusable(answer: Any, why: str) -> None:
    conversation = [*HEAD, *turn(1), *turn(2), *turn(3)]
    with pytest.raises(CompactionError, match=why) as caught:
        await compact_history(
            conversation, llm=ScriptedChatModel([answer]), model=None, keep_recent=0
        )
    assert caught.value.reason == "unusable_summary"


async def test_reasoning_around_a_summary_is_not_kept() -> None:
    conversation = [*HEAD, *turn(1), *turn(2), *turn(3)]
    compaction = await compact_history(
        conversation,
        llm=ScriptedChatModel([final_answer("<think>hmm</think>Facts found: x.")]),
        model=None,
        keep_recent=0,
    )
    assert compaction.summary == "Facts found: x."


async def test_when_every_turn_fits_the_budget_all_but_the_last_are_folded() -> None:
    conversation = [*HEAD, *turn(1), *turn(2), *turn(3)]
    compaction = await compact_history(
        conversation, llm=summariser(), model=None, keep_recent=10**6, head=len(HEAD)
    )
    assert compaction.folded_turns == 2
    assert compaction.messages[-2:] == turn(3)


async def test_the_summariser_keeps_a_quarter_of_its_context_for_its_answer() -> None:
    seen: list[CompletionRequest] = []

    def record(request: CompletionRequest) -> CompletionResponse:
        seen.append(request)
        return final_answer("Facts found: x.")

    conversation = [*HEAD, *(m for n in range(1, 30) for m in turn(n, 2000)), *turn(99)]
    await compact_history(
        conversation,
        llm=FunctionChatModel(record),
        model=None,
        keep_recent=0,
        max_input_tokens=8000,
    )
    assert seen[0].max_tokens == 2000
    assert estimate_tokens(seen[0].messages[-1].content or "") <= 8000 - 2000


async def test_a_context_still_over_the_window_after_compacting_ends_the_run() -> None:
    async def huge(args: dict[str, Any], ctx: ToolContext) -> str:
        return "h" * 40_000  # 10,000 tokens: more than the whole context by itself

    def answer(request: CompletionRequest) -> CompletionResponse:
        done = sum(m.role == "assistant" for m in request.messages)
        return tool_calls(("huge" if done == 2 else "look", {}), usage=TokenUsage())

    model = FunctionChatModel(answer)
    tools = [LOOK, ToolSpec("huge", "Huge.", {"type": "object"}, "read", huge)]
    compactor = Compactor(llm=summariser(), max_ctx=8000)
    result = await run_planner_loop(loop_input(compactor, tools=tools), llm=model)
    assert result.stop_reason == "context_exhausted"
    assert "more than the whole context even after compacting" in (result.error or "")
    # no request went out holding the huge result
    assert not any(len(m.content or "") >= 40_000 for r in model.requests for m in r.messages)


async def test_the_count_after_a_compaction_keeps_what_no_message_shows() -> None:
    def answer(request: CompletionRequest) -> CompletionResponse:
        done = sum(m.role == "assistant" for m in request.messages)
        if done >= 6:
            return final_answer("done")
        # tool definitions and framing: 900 tokens the messages do not show
        return tool_calls(("look", {}), usage=TokenUsage(prompt_tokens=900 + 160 * done))

    sink = RecordingSink()
    compactor = Compactor(llm=summariser(), max_ctx=2000, keep_recent_tokens=200)
    await run_planner_loop(loop_input(compactor), llm=FunctionChatModel(answer), sink=sink)
    made = [e.compaction for e in sink.of_type(Compacted)]
    [compaction] = made
    assert compaction.tokens_before >= 0.92 * 2000
    estimated_saving = sum(estimate_message_tokens(m) for m in compaction.folded)
    assert compaction.tokens_after > compaction.tokens_before - estimated_saving
    assert compaction.tokens_after > 900  # the overhead stays counted


async def test_a_resumed_run_starts_from_the_count_its_checkpoint_carries() -> None:
    # the earlier attempt's count: 3,900 tokens (tool definitions and framing included);
    # estimating the messages alone would say about 900
    log = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="go")]
    for n in range(1, 4):
        log += turn(n, 1000)
    model = looping_model(rounds_then_answer=0)
    summaries: list[CompletionRequest] = []

    def summarise(request: CompletionRequest) -> CompletionResponse:
        summaries.append(request)
        return final_answer("Facts found: x.")

    compactor = Compactor(llm=FunctionChatModel(summarise), max_ctx=4000, keep_recent_tokens=10)
    resume = Checkpoint(messages=log, rounds_done=3, context_tokens=3900)
    result = await run_planner_loop(loop_input(compactor, resume=resume), llm=model)
    assert len(summaries) == 1  # compacted before the first request it sent
    [request] = model.requests
    assert any((m.content or "").startswith("<summary of") for m in request.messages)
    assert result.stop_reason == "final_answer"


async def test_tool_definitions_count_before_the_provider_reports_any_usage() -> None:
    big = ToolSpec("big", "d" * 4000, {"type": "object"}, "read", _look)  # ~1,000 tokens
    model = looping_model()
    compactor = Compactor(llm=summariser(), max_ctx=1000)
    result = await run_planner_loop(loop_input(compactor, tools=[LOOK, big]), llm=model)
    assert result.stop_reason == "context_exhausted" and model.requests == []
    assert "compacting could not help" in (result.error or "")


async def test_a_request_its_reminders_would_push_over_the_context_is_not_sent() -> None:
    model = looping_model()
    compactor = Compactor(llm=summariser(), max_ctx=300)
    channel = lambda state: ["r" * 1200]  # noqa: E731  (300 tokens of reminder)
    result = await run_planner_loop(
        loop_input(compactor, reminder_channel=channel, tools=[]), llm=model
    )
    assert result.stop_reason == "context_exhausted" and model.requests == []
    assert "with this round's reminders the request would not fit" in (result.error or "")


async def test_a_summary_folded_again_still_counts_the_turns_it_stood_for() -> None:
    first = await compact_history(
        [*HEAD, *turn(1), *turn(2), *turn(3), *turn(4)],
        llm=summariser(),
        model=None,
        keep_recent=0,
        head=len(HEAD),
    )
    assert (first.messages[len(HEAD)].content or "").startswith("<summary of 3 earlier turn(s)")
    second = await compact_history(
        [*first.messages, *turn(5), *turn(6)],
        llm=summariser("Facts: y."),
        model=None,
        keep_recent=0,
        head=len(HEAD),
    )
    assert second.folded_turns == 2  # turns 4 and 5, besides the first summary
    assert (second.messages[len(HEAD)].content or "").startswith("<summary of 5 earlier turn(s)")


def test_the_tool_definitions_are_estimated_as_their_json_text() -> None:
    """The loop counts the tool definitions from each tool's size, as the JSON of the list."""
    from planner.context_window import _tools_tokens

    async def nothing(args: dict[str, object], ctx: object) -> None:
        return None

    specs = [
        ToolSpec(
            name=f"tool_{i}",
            description="Schreibt eine Notiz — «wörtlich»" * i,
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
            policy_hint="read",
            handler=nothing,
        )
        for i in range(1, 4)
    ]
    for n in range(1, 4):
        tools = [spec.to_openai_tool() for spec in specs[:n]]
        assert _tools_tokens(specs[:n]) == estimate_tokens(json.dumps(tools))
