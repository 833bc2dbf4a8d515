"""The stored log rewritten for the wire: unique ids, valid names, arguments, provider fields."""

from __future__ import annotations

from typing import Any

import pytest

from planner import ChatMessage, ReplyInfo, ToolCall
from worker.llm.openai_request import wire_messages, wire_tool_name


def assistant(*calls: ToolCall, endpoint: str | None = None, **fields: Any) -> ChatMessage:
    info = ReplyInfo(endpoint=endpoint) if endpoint else None
    return ChatMessage(role="assistant", tool_calls=calls, provider_fields=fields, reply_info=info)


def result(call_id: str, content: str = "{}") -> ChatMessage:
    return ChatMessage(role="tool", tool_call_id=call_id, content=content)


def ids(wire: list[dict[str, Any]]) -> list[str]:
    out = []
    for message in wire:
        out += [c["id"] for c in message.get("tool_calls", [])]
        if message["role"] == "tool":
            out.append(f"->{message['tool_call_id']}")
    return out


def test_an_id_repeated_in_a_later_round_is_renamed_in_the_call_and_its_result() -> None:
    call = ToolCall(id="clock_now:0", name="clock_now")
    log = [
        ChatMessage(role="user", content="time?"),
        assistant(call),
        result("clock_now:0", "a"),
        assistant(call),
        result("clock_now:0", "b"),
        assistant(call),
        result("clock_now:0", "c"),
    ]
    wire = wire_messages(log, endpoint=None)
    assert ids(wire) == [
        "clock_now:0",
        "->clock_now:0",
        "clock_now:0-2",
        "->clock_now:0-2",
        "clock_now:0-3",
        "->clock_now:0-3",
    ]
    assert [m["content"] for m in wire if m["role"] == "tool"] == ["a", "b", "c"]
    assert log[3].tool_calls[0].id == "clock_now:0"  # the stored log keeps the provider's id


def test_ids_repeated_inside_one_reply_are_answered_in_order() -> None:
    first = ToolCall(id="call_0", name="clock_now")
    second = ToolCall(id="call_0", name="save_note", arguments={"title": "t"})
    log = [assistant(first, second), result("call_0", "one"), result("call_0", "two")]
    wire = wire_messages(log, endpoint=None)
    assert ids(wire) == ["call_0", "call_0-2", "->call_0", "->call_0-2"]
    assert wire[2]["content"] == "two"


def test_a_renamed_id_never_collides_with_an_id_the_provider_used() -> None:
    log = [
        assistant(ToolCall(id="a-2", name="x")),
        result("a-2"),
        assistant(ToolCall(id="a", name="x")),
        result("a"),
        assistant(ToolCall(id="a", name="x")),
        result("a"),
    ]
    assert ids(wire_messages(log, endpoint=None)) == ["a-2", "->a-2", "a", "->a", "a-3", "->a-3"]


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        ("clock_now", "clock_now"),
        ("unknown_but_valid", "unknown_but_valid"),
        ("multi_tool_use.parallel", "multi_tool_use_parallel"),  # the example
        ("functions.notes_list", "functions_notes_list"),
        ("clock now", "invalid_clock_now"),  # would read as the real tool clock_now
        ("", "invalid_tool_name"),
        ("x" * 80, "x" * 64),
        ("Zeit/jetzt?", "Zeit_jetzt_"),
        ("时间", "__"),
    ],
)
def test_invalid_tool_names_get_a_valid_stand_in(name: str, wire: str) -> None:
    assert wire_tool_name(name, ["clock_now", "save_note"]) == wire


def test_arguments_that_could_not_be_decoded_are_sent_as_an_empty_object() -> None:
    broken = ToolCall(id="c1", name="save_note", parse_error="cut", raw_arguments='{"title": "ti')
    fine = ToolCall(id="c2", name="save_note", arguments={"title": "Zeit ⌚"})
    [wire] = wire_messages([assistant(broken, fine)], endpoint=None)
    assert [c["function"]["arguments"] for c in wire["tool_calls"]] == [
        "{}",
        '{"title": "Zeit ⌚"}',
    ]


def test_provider_fields_go_back_only_to_the_endpoint_that_sent_them() -> None:
    call = ToolCall(
        id="c1",
        name="clock_now",
        provider_fields={"extra_content": {"google": {"thought_signature": "c2ln"}}},
    )
    message = assistant(call, endpoint="primary", reasoning_content="Need the time.")
    [to_primary] = wire_messages([message], endpoint="primary")
    assert to_primary["reasoning_content"] == "Need the time."
    assert to_primary["tool_calls"][0]["extra_content"] == {"google": {"thought_signature": "c2ln"}}
    [to_fallback] = wire_messages([message], endpoint="fallback")
    assert "reasoning_content" not in to_fallback
    assert "extra_content" not in to_fallback["tool_calls"][0]
    # a message without a recorded endpoint (an in-process model, prior messages) sends them
    [unknown] = wire_messages([assistant(call, reasoning_content="r")], endpoint="fallback")
    assert unknown["reasoning_content"] == "r"


def test_provider_fields_never_replace_the_wire_fields() -> None:
    message = assistant(ToolCall(id="c1", name="x"), role="system", tool_calls="nope")
    [wire] = wire_messages([message], endpoint=None)
    assert wire["role"] == "assistant" and wire["tool_calls"][0]["id"] == "c1"
