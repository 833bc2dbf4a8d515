"""`mana-ai replay`'s restoration of folded turns, on logs compacted by the real compactor."""

from __future__ import annotations

from typing import Any

import pytest

from planner import ChatMessage, CompletionRequest, CompletionResponse, ToolCall
from planner.compaction import Compaction, compact_history
from planner.testing import FunctionChatModel
from worker.admin.replay import ReplayError, replay_events, restored_log
from worker.admin.replay_render import render_markdown, render_text
from worker.store.rows import messages_json


def turn(n: int, calls: int = 1) -> list[ChatMessage]:
    ids = [f"r{n}c{i}" for i in range(calls)]
    return [
        ChatMessage(
            role="assistant",
            content=f"turn {n} " + "thinking " * 40,
            tool_calls=tuple(ToolCall(id=i, name="clock_now") for i in ids),
        ),
        *(ChatMessage(role="tool", content=f"result of {i} " * 10, tool_call_id=i) for i in ids),
    ]


def summariser(text: str) -> FunctionChatModel:
    def answer(request: CompletionRequest) -> CompletionResponse:
        return CompletionResponse(message=ChatMessage(role="assistant", content=text))

    return FunctionChatModel(answer)


def archive_row(index: int, round_no: int, c: Compaction) -> dict[str, Any]:
    return {
        "compaction_index": index,
        "round": round_no,
        "start_index": c.start,
        "folded": messages_json(c.folded),
        "folded_turns": c.folded_turns,
        "summary": c.summary,
        "tokens_before": c.tokens_before,
        "tokens_after": c.tokens_after,
        "model": None,
        "duration_ms": 1.0,
        "attempt": 1,
        "error": None,
    }


async def twice_compacted() -> tuple[list[ChatMessage], dict[str, Any]]:
    """A conversation of 7 turns compacted before turn 5 and again before turn 8 (the second
    folds the first's summary too); returns the whole conversation and the stored iteration."""
    head = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Go")]
    whole = [*head, *turn(1), *turn(2, calls=3), *turn(3), *turn(4, calls=2)]
    first = await compact_history(whole, llm=summariser("first"), model=None, keep_recent=60)
    later = [*turn(5), *turn(6, calls=2), *turn(7)]
    whole += later
    second = await compact_history(
        [*first.messages, *later], llm=summariser("second"), model=None, keep_recent=60
    )
    assert second.folded[0] == first.messages[first.start]  # the first summary, folded again
    failed = archive_row(3, 8, second) | {"error": "llm_error: down", "folded": []}
    iteration = {
        "id": 7,
        "mission_id": 3,
        "status": "succeeded",
        "stop_reason": "final_answer",
        "rounds": 7,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "messages": messages_json(second.messages),
        "compactions": [archive_row(1, 5, first), archive_row(2, 8, second), failed],
        "reminders": [{"round": 2, "producer": "rounds_left", "text": "hurry"}],
        "tool_invocations": [],
    }
    return whole, iteration


async def test_restoring_the_archive_gives_back_the_whole_conversation() -> None:
    whole, iteration = await twice_compacted()
    assert restored_log(iteration["messages"], iteration["compactions"]) == messages_json(whole)


async def test_events_mark_each_compaction_around_what_it_folded_nested_included() -> None:
    whole, iteration = await twice_compacted()
    events = replay_events(iteration)
    marks = [(e["event"], e.get("index")) for e in events if e["event"].startswith("compaction")]
    assert marks == [
        ("compaction", 2),
        ("compaction", 1),
        ("compaction_end", 1),
        ("compaction_end", 2),
        ("compaction_failed", 3),
    ]
    messages = [e for e in events if e["event"] == "message"]
    assert [e["message"] for e in messages] == messages_json(whole)
    folded_by = {e["message"].get("content", "")[:7]: e["folded_by"] for e in messages}
    assert folded_by["turn 1 "] == 1 and folded_by["turn 5 "] == 2 and folded_by["turn 7 "] is None
    rounds = [e for e in events if e["event"] == "round"]
    assert [e["round"] for e in rounds] == [1, 2, 3, 4, 5, 6, 7]
    assert rounds[1]["reminders"] == [{"producer": "rounds_left", "text": "hurry"}]

    lines: list[str] = []
    render_text(iteration, events, lines.append)
    text = "\n".join(lines)
    assert "| | -- round 1 --" in text  # folded twice: two bars
    assert "| -- round 5 --" in text and "\n-- round 7 --" in text
    assert "> second" in text and "> first" in text


async def test_an_archive_that_does_not_fit_its_log_is_refused_with_a_reason() -> None:
    _, iteration = await twice_compacted()
    iteration["compactions"][0]["start_index"] = 0
    with pytest.raises(
        ReplayError, match="compaction 1 replaced its turns with a summary at message 0"
    ):
        replay_events(iteration)
    _, iteration = await twice_compacted()
    iteration["compactions"][1]["start_index"] = 99
    with pytest.raises(ReplayError, match="compaction 2"):
        restored_log(iteration["messages"], iteration["compactions"])


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda it: it.update(messages={"not": "a list"}), "the stored message log is not a list"),
        (lambda it: it["messages"].append({"content": "no role"}), "has no valid role"),
        (
            lambda it: it["messages"].append(
                {"role": "assistant", "tool_calls": [{"id": "x", "arguments": {}}]}
            ),
            "has a tool call without a name",
        ),
        (lambda it: it["compactions"][0].update(folded={"a": 1}), "compaction 1 of the archive"),
        (lambda it: it["compactions"][1].update(folded=[1, 2, None]), "compaction 2 of the arch"),
        (
            lambda it: it["reminders"].append({"round": "x", "producer": "p", "text": "t"}),
            "reminder 2",
        ),
        (lambda it: it["reminders"].append({"round": 3, "text": "t"}), "reminder 2"),
    ],
)
async def test_a_malformed_iteration_is_refused_with_what_is_wrong(
    change: Any, complaint: str
) -> None:
    _, iteration = await twice_compacted()
    change(iteration)
    with pytest.raises(ReplayError, match=complaint):
        replay_events(iteration)


async def test_text_replay_keeps_every_line_in_its_fold_and_shows_hidden_characters() -> None:
    _, iteration = await twice_compacted()
    iteration["compactions"][0]["folded"][0]["content"] = "line one\nline two \u202e\x1b[31m"
    lines: list[str] = []
    render_text(iteration, replay_events(iteration), lines.append)
    at = next(i for i, line in enumerate(lines) if "line one" in line)
    assert lines[at].startswith("| | [assistant] line one")
    assert lines[at + 1] == "| |     line two \\u202e\\u001b[31m"
    assert not any("\x1b" in line or "\u202e" in line for line in lines)


async def test_markdown_replay_cannot_be_broken_out_of_by_what_it_quotes() -> None:
    _, iteration = await twice_compacted()
    iteration["compactions"][0]["folded"][0]["content"] = "# not a heading\n```\nstill code"
    out: list[str] = []
    render_markdown(iteration, replay_events(iteration), out.append)
    at = out.index("# not a heading")
    assert out[at - 1] == "````text" and out[at + 2] == "still code" and out[at + 3] == "````"
