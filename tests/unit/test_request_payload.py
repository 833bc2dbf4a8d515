"""The bytes an OpenAI-compatible endpoint is sent are ``encode_body(request_body(request))``,
whatever the request, although each tool definition is encoded once per endpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.llm import CompletionRequest
from planner.messages import ChatMessage, ToolCall
from planner.tools import ToolSpec
from worker.llm.openai_compat import OpenAICompatibleChatModel
from worker.llm.openai_request import encode_body


async def _noop(args: dict[str, Any], ctx: Any) -> None:
    return None


SPECS = [
    ToolSpec(
        name=f"tool_{i}",
        description=f"Tool {i} \ud800 with a lone surrogate" if i == 2 else f"Tool {i}",
        input_schema={
            "type": "object",
            "properties": {"x": {"type": "string", "format": "date-time", "default": "é"}},
            "additionalProperties": False,
        },
        policy_hint="read",
        handler=_noop,
    )
    for i in range(4)
]
ODD_TOOLS = [
    {"type": "function", "function": {"name": "bare"}},  # no parameters
    {"function": SPECS[3].to_openai_tool()["function"], "type": "function"},  # keys reversed
    {"type": "function", "function": SPECS[0].to_openai_tool()["function"], "strict": True},
    {"type": "custom", "function": SPECS[1].to_openai_tool()["function"]},
    {"no": "function"},
]

_text = st.text(alphabet=st.characters(codec=None, blacklist_categories=()), max_size=10)
_messages = st.lists(
    st.builds(
        ChatMessage,
        role=st.sampled_from(["system", "user", "assistant", "tool"]),
        content=st.none() | _text,
        tool_calls=st.lists(
            st.builds(ToolCall, id=_text, name=st.sampled_from(["tool_0", "bare", "x y"])),
            max_size=2,
        ).map(tuple),
        tool_call_id=st.none() | _text,
    ),
    max_size=4,
)
_tools = st.lists(
    st.sampled_from(SPECS).map(lambda s: s.to_openai_tool()) | st.sampled_from(ODD_TOOLS),
    max_size=5,
)
ENDPOINTS = [
    OpenAICompatibleChatModel(base_url="http://127.0.0.1:9/v1"),
    OpenAICompatibleChatModel(base_url="http://127.0.0.1:9/v1", default_model="m"),
    OpenAICompatibleChatModel(base_url="http://127.0.0.1:9/v1", schema_dialect="gemini"),
    OpenAICompatibleChatModel(
        base_url="http://127.0.0.1:9/v1", strip_schema_keywords=["format", "default"]
    ),
]


@settings(max_examples=300, deadline=None)
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    messages=_messages,
    tools=_tools,
    model=st.none() | _text,
    tool_choice=st.sampled_from(["auto", "required", "none"]),
    temperature=st.none() | st.floats(0, 2),
    max_tokens=st.none() | st.integers(1, 10**6),
)
def test_the_payload_is_the_encoded_request_body(
    endpoint: OpenAICompatibleChatModel,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]],
    model: str | None,
    tool_choice: Any,
    temperature: float | None,
    max_tokens: int | None,
) -> None:
    request = CompletionRequest(
        messages=messages,
        tools=tools,
        model=model,
        tool_choice=tool_choice,
        temperature=temperature,
        max_tokens=max_tokens,
    )
    for _ in range(2):  # encoded, then from what this endpoint kept
        payload, text = endpoint._payload(request)
        assert payload == encode_body(endpoint.request_body(request))
        assert text == payload.decode("utf-8") or "\ufffd" in payload.decode("utf-8")


def test_a_definition_is_encoded_once_per_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = OpenAICompatibleChatModel(base_url="http://127.0.0.1:9/v1", schema_dialect="gemini")
    request = CompletionRequest(
        messages=[ChatMessage(role="user", content="hi")],
        tools=[spec.to_openai_tool() for spec in SPECS],
    )
    first, _ = endpoint._payload(request)
    encoded: list[Any] = []
    real_dumps = json.dumps

    def counting(value: Any, **kwargs: Any) -> str:
        encoded.append(value)
        return real_dumps(value, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    again = CompletionRequest(  # another run of the same tools: new tool dicts, same specs
        messages=[ChatMessage(role="user", content="hi")],
        tools=[spec.to_openai_tool() for spec in SPECS],
    )
    assert endpoint._payload(again)[0] == first
    assert not any(isinstance(value, dict) and "function" in value for value in encoded)


def test_what_can_change_is_sent_as_it_is_now() -> None:
    endpoint = OpenAICompatibleChatModel(base_url="http://127.0.0.1:9/v1")
    mine = {"name": "mine", "description": "v1", "parameters": {"type": "object"}}
    spec_tool = SPECS[0].to_openai_tool()

    def payload() -> bytes:
        request = CompletionRequest(
            messages=[ChatMessage(role="user", content="hi")],
            tools=[{"type": "function", "function": mine}, spec_tool],
        )
        sent = endpoint._payload(request)[0]
        assert sent == encode_body(endpoint.request_body(request))
        return sent

    assert b'"v1"' in payload()
    mine["description"] = "v2"  # a caller's own definition, changed between requests
    assert b'"v2"' in payload()
    endpoint.strip_schema_keywords = frozenset({"additionalProperties"})  # set afterwards
    assert b"additionalProperties" not in payload()
