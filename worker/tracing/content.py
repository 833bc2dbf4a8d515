"""The opt-in content attributes of GenAI spans (``MANA_AI_OTEL_CAPTURE_CONTENT=true``), as
JSON strings in the shapes the conventions define (v1.40.0, docs/gen-ai/
gen-ai-input-messages.json and gen-ai-output-messages.json): a message is
``{"role", "parts": [...]}``, a part ``{"type": "text", "content"}``,
``{"type": "tool_call", "id", "name", "arguments"}`` or
``{"type": "tool_call_response", "id", "response"}``; an output message also carries its
``finish_reason``. The span processor's attribute length limit
(``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``) cuts long values; nothing is cut here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from planner import ChatMessage, ExecutedCall

__all__ = ["input_messages", "output_messages", "tool_arguments", "tool_result"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)


def _parts(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        ]
    parts: list[dict[str, Any]] = []
    if message.content:
        parts.append({"type": "text", "content": message.content})
    for call in message.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return parts


def input_messages(messages: Iterable[ChatMessage]) -> str:
    """``gen_ai.input.messages``: ``messages`` in the order they were sent."""
    return _ENCODER.encode([{"role": m.role, "parts": _parts(m)} for m in messages])


def output_messages(message: ChatMessage, finish_reason: str | None) -> str:
    """``gen_ai.output.messages``: the one reply (choice) a request got."""
    return _ENCODER.encode(
        [{"role": message.role, "parts": _parts(message), "finish_reason": finish_reason or ""}]
    )


def tool_arguments(executed: ExecutedCall) -> str:
    """``gen_ai.tool.call.arguments``: the arguments as the model gave them (decoded)."""
    return _ENCODER.encode(executed.call.arguments)


def tool_result(executed: ExecutedCall) -> str:
    """``gen_ai.tool.call.result``: the result, or ``{"error": ...}`` as the model read it."""
    if executed.error is not None:
        return _ENCODER.encode({"error": executed.error})
    try:
        return _ENCODER.encode(executed.result)
    except (ValueError, RecursionError):  # what tool_result_message also refuses
        return _ENCODER.encode({"error": "the result is not JSON"})
