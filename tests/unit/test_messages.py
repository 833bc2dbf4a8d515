"""The stored message log format round-trips through JSON unchanged."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from planner import ChatMessage, TokenUsage, ToolCall, messages_from_json, messages_to_json


def test_message_log_round_trips_through_json_text() -> None:
    log = [
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="user", content="hi ünïcode"),
        ChatMessage(
            role="assistant",
            tool_calls=(ToolCall(id="c1", name="clock_now", arguments={"timezone": "UTC"}),),
        ),
        ChatMessage(role="tool", content='{"now": "x"}', tool_call_id="c1"),
        ChatMessage(role="assistant", content="done"),
    ]
    text = json.dumps(messages_to_json(log))
    assert messages_from_json(json.loads(text)) == log


def test_stored_format_leaves_out_empty_fields() -> None:
    assert ChatMessage(role="user", content="hi").to_json() == {"role": "user", "content": "hi"}


def test_malformed_entry_is_rejected() -> None:
    with pytest.raises(pydantic.ValidationError):
        messages_from_json([{"role": "wizard", "content": "x"}])


def test_usage_adds_up() -> None:
    total = TokenUsage(prompt_tokens=3, completion_tokens=4) + TokenUsage(prompt_tokens=1)
    assert (total.prompt_tokens, total.completion_tokens, total.total_tokens) == (4, 4, 8)


def test_messages_are_frozen() -> None:
    message = ChatMessage(role="user", content="hi")
    with pytest.raises(pydantic.ValidationError):
        message.content = "changed"  # type: ignore[misc]


UNSTORABLE = [
    ({"t": "a\x00b"}, {"t": "a\ufffdb"}),
    ({"t": "\ud800"}, {"t": "\ufffd"}),
    ({"k\x00": ["\udfff", {"n": "\x00\ud83d"}]}, {"k\ufffd": ["\ufffd", {"n": "\ufffd\ufffd"}]}),
    ({"emoji": "\U0001f600 fine"}, {"emoji": "\U0001f600 fine"}),
]


@pytest.mark.parametrize(("sent", "stored"), UNSTORABLE)
def test_text_a_store_cannot_hold_is_made_storable_once_for_the_call_its_row_and_its_hash(
    sent: dict[str, Any], stored: dict[str, Any]
) -> None:
    from planner import arguments_hash

    call = ToolCall(id="c\x00", name="n", arguments=sent, raw_arguments="\ud800")
    assert call.arguments == stored and call.id == "c\ufffd" and call.raw_arguments == "\ufffd"
    message = ChatMessage(role="assistant", content="x\x00", tool_calls=(call,))
    again = ChatMessage.from_json(json.loads(json.dumps(message.to_json())))
    assert again == message and again.content == "x\ufffd"
    # the hash a person's approval is bound to: the same for the call as sent and as stored
    assert arguments_hash(sent) == arguments_hash(stored) == arguments_hash(call.arguments)
