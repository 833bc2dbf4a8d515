"""What the embedded model may call, and its grammar-forced reply read back: shared by both
runtimes of the embedded model (``LocalLlamaChatModel``, llama-cpp-python, and
``LocalNumpyChatModel``, numpy and llguidance).

The reply is forced into ``worker.llm.embedded.local_grammar``'s schema; the rules that narrow
the tools on offer (no tool twice in one turn, at most ``max_tool_rounds`` tool-calling replies
per turn) are tuned on SmolLM2-135M (see ``worker.llm.embedded.local``).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from planner.errors import LLMResponseError
from planner.llm import CompletionRequest, CompletionResponse
from planner.messages import ChatMessage, TokenUsage, ToolCall
from worker.llm.embedded.local_grammar import tool_function

__all__ = [
    "call_ids",
    "offered_tools",
    "parse_reply",
    "tool_rounds_in_turn",
    "unused_tools",
]

_EXCERPT_CHARS = 500


def call_ids() -> Iterator[str]:
    """Fresh tool-call ids for one model: ``local_1``, ``local_2``, ..."""
    return (f"local_{n}" for n in itertools.count(1))


def tool_rounds_in_turn(messages: Sequence[ChatMessage]) -> int:
    """Assistant messages with tool calls since the last user message."""
    count = 0
    for message in reversed(messages):
        if message.role == "user":
            break
        if message.role == "assistant" and message.tool_calls:
            count += 1
    return count


def unused_tools(
    tools: Sequence[dict[str, Any]], messages: Sequence[ChatMessage]
) -> list[dict[str, Any]]:
    """``tools`` minus those already called since the last user message."""
    called: set[str] = set()
    for message in reversed(messages):
        if message.role == "user":
            break
        called.update(call.name for call in message.tool_calls)
    return [t for t in tools if tool_function(t).get("name") not in called]


def offered_tools(
    request: CompletionRequest, *, repeat_tools: bool, max_tool_rounds: int | None
) -> list[dict[str, Any]]:
    """The tools the reply may call: none with ``tool_choice="none"`` or, with ``"auto"``,
    after ``max_tool_rounds`` tool-calling replies in this turn; unless ``repeat_tools``, not
    those already called in this turn (with ``"required"`` all of them again once every tool
    was called)."""
    tools = list(request.tools) if request.tool_choice != "none" else []
    if request.tool_choice == "auto" and (
        max_tool_rounds is not None and tool_rounds_in_turn(request.messages) >= max_tool_rounds
    ):
        tools = []
    if not repeat_tools:
        tools = unused_tools(tools, request.messages) or (
            tools if request.tool_choice == "required" else []
        )
    return tools


def parse_reply(
    text: str, *, finish_reason: str | None, usage: TokenUsage, ids: Iterator[str]
) -> CompletionResponse:
    """The response for the grammar-forced reply ``text``: tool calls (identical repeats
    dropped, ids from ``ids``), a text answer, or an answer cut at ``max_tokens``
    (``finish_reason`` ``"length"``) as any endpoint sends it.

    Raises:
        LLMResponseError: ``text`` is no such reply (quoted, cut at 500 characters).
    """
    try:
        reply = json.loads(text, strict=False)  # the grammar allows raw newlines
    except json.JSONDecodeError as exc:
        partial = _cut_answer(text) if finish_reason == "length" else None
        if partial is not None:  # an answer cut at max_tokens: what an endpoint sends
            return CompletionResponse(
                message=ChatMessage(role="assistant", content=partial),
                usage=usage,
                finish_reason="length",
            )
        cut = " (cut off at max_tokens)" if finish_reason == "length" else ""
        raise LLMResponseError(
            f"local model reply is not the forced JSON{cut}: {exc.msg}: {_excerpt(text)}"
        ) from exc
    if isinstance(reply, dict) and isinstance(reply.get("tool_calls"), list):
        calls = _tool_calls(reply["tool_calls"], ids)
        if calls:
            return CompletionResponse(
                message=ChatMessage(role="assistant", tool_calls=calls),
                usage=usage,
                finish_reason="tool_calls",
            )
    if isinstance(reply, dict) and isinstance(reply.get("answer"), str):
        return CompletionResponse(
            message=ChatMessage(role="assistant", content=reply["answer"]),
            usage=usage,
            finish_reason=finish_reason,
        )
    raise LLMResponseError(f"local model reply has neither tool_calls nor answer: {_excerpt(text)}")


def _tool_calls(raw_calls: list[Any], ids: Iterator[str]) -> tuple[ToolCall, ...]:
    """ToolCalls from the parsed reply, identical repeats dropped.

    A small model tends to fill the allowed calls with copies of the first one; running the
    same call twice in one turn is never what it meant.
    """
    seen: set[str] = set()
    calls: list[ToolCall] = []
    for call in raw_calls:
        if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
            continue
        key = json.dumps([call.get("name"), call["arguments"]], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        calls.append(
            ToolCall(id=next(ids), name=str(call.get("name")), arguments=call["arguments"])
        )
    return tuple(calls)


_ANSWER_START = re.compile(r'\A\s*\{\s*"answer"\s*:\s*"')


def _cut_answer(text: str) -> str | None:
    """The text of a forced-JSON ``{"answer": "..."}`` reply cut off at max_tokens inside its
    string, or ``None`` when ``text`` is no such reply (or nothing of the answer came). The
    loop then treats it as any endpoint's cut answer (``finish_reason`` ``length``): it asks
    again for a shorter one, or ends ``truncated``."""
    start = _ANSWER_START.match(text)
    if start is None:
        return None
    fragment = text[start.end() :]
    for trim in range(7):  # a cut may end inside an escape such as \u00e9
        try:
            answer = json.loads(f'"{fragment[: len(fragment) - trim]}"', strict=False)
        except json.JSONDecodeError:
            continue
        return answer if isinstance(answer, str) and answer.strip() else None
    return None


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"
