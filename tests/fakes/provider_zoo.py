"""The provider zoo: reply shapes real OpenAI-compatible endpoints send, and the request checks
strict ones apply, for ``FakeLLMServer``.

Each builder returns one JSON reply body; each check is a ``RequestCheck`` for
``FakeLLMServer(checks=[...])``. A new provider quirk is a builder or a check here plus a
one-line test::

    server.enqueue(json=error_in_200(429, "rate limited"))
    server.enqueue(json=reply(content=None, finish_reason="content_filter"))
    FakeLLMServer(checks=[unique_tool_call_ids, valid_tool_names])

Shapes come from public bug reports of agent runtimes against vLLM, Ollama, LiteLLM,
OpenRouter, DeepSeek, Gemini's compatibility layer and Azure.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.llm_server import RequestCheck

__all__ = [
    "DEFAULT_USAGE",
    "Call",
    "arguments_are_json_objects",
    "choice_error",
    "error_in_200",
    "refuses_schema_keywords",
    "reply",
    "requires_assistant_field",
    "unique_tool_call_ids",
    "valid_tool_names",
]

DEFAULT_USAGE: Mapping[str, int] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}

_ids = itertools.count(1)
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Call:
    """One tool call in a reply.

    ``arguments`` is JSON-encoded when it is a dict and sent as is otherwise (a string, to
    script odd encodings; ``None`` to send null). ``id`` ``None`` generates a unique one;
    ``extra`` adds fields next to ``id`` / ``function`` (e.g. Gemini's ``extra_content``).
    """

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        arguments = self.arguments
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments)
        return {
            "id": self.id if self.id is not None else f"call_zoo_{next(_ids)}",
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
            **self.extra,
        }


def reply(
    content: str | None = None,
    calls: Iterable[Call | tuple[str, Any]] = (),
    *,
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = DEFAULT_USAGE,
    message_extra: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A chat completion body.

    Args:
        content: ``message.content`` (``None`` sends null).
        calls: tool calls, as ``Call`` or ``(name, arguments)``.
        finish_reason: default ``tool_calls`` with calls, else ``stop``.
        usage: the ``usage`` object; ``None`` leaves it out.
        message_extra: more fields on the message (``reasoning_content`` …).
        extra: more top-level fields.
    """
    wire_calls = [(c if isinstance(c, Call) else Call(*c)).to_json() for c in calls]
    message: dict[str, Any] = {"role": "assistant", "content": content, **(message_extra or {})}
    if wire_calls:
        message["tool_calls"] = wire_calls
    body: dict[str, Any] = {
        "id": f"chatcmpl-zoo-{next(_ids)}",
        "object": "chat.completion",
        "model": "zoo-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if wire_calls else "stop"),
            }
        ],
        **(extra or {}),
    }
    if usage is not None:
        body["usage"] = dict(usage)
    return body


def error_in_200(code: Any, message: str, **fields: Any) -> dict[str, Any]:
    """An error object where the answer should be (OpenRouter, LiteLLM; sent with HTTP 200)."""
    return {"error": {"code": code, "message": message, **fields}}


def choice_error(code: Any, message: str) -> dict[str, Any]:
    """A choice that ended in an error mid-answer (OpenRouter's shape)."""
    body = reply(content="", finish_reason="error")
    body["choices"][0]["error"] = {"code": code, "message": message}
    return body


# -- strict-backend checks ---------------------------------------------------------------------


def unique_tool_call_ids(body: dict[str, Any]) -> str | None:
    """Tool-call ids are unique in the conversation, and each tool result answers a call of
    the assistant turn before it (OpenAI, Anthropic-backed proxies, vLLM's Mistral template)."""
    seen: set[str] = set()
    turn: set[str] = set()
    for i, message in enumerate(body.get("messages", [])):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            turn = set()
            for call in message["tool_calls"]:
                if call["id"] in seen:
                    return f"messages[{i}]: duplicate tool_call id {call['id']!r}"
                seen.add(call["id"])
                turn.add(call["id"])
        if message.get("role") == "tool" and message.get("tool_call_id") not in turn:
            return f"messages[{i}]: tool_call_id {message.get('tool_call_id')!r} answers no call"
    return None


def system_message_first_only(body: dict[str, Any]) -> str | None:
    """A system message only at the start (the chat templates of Mistral and Gemma raise on
    any other, so vLLM and Ollama answer 400 or 500)."""
    for i, message in enumerate(body.get("messages", [])):
        if i > 0 and message.get("role") == "system":
            return f"messages[{i}]: a system message after the first"
    return None


def valid_tool_names(body: dict[str, Any]) -> str | None:
    """Function names in the history match ``^[a-zA-Z0-9_-]{1,64}$`` (OpenAI's rule)."""
    for i, message in enumerate(body.get("messages", [])):
        for call in message.get("tool_calls") or []:
            name = call["function"]["name"]
            if not _NAME.match(name):
                return f"messages[{i}].tool_calls: invalid function name {name!r}"
    return None


def arguments_are_json_objects(body: dict[str, Any]) -> str | None:
    """Tool-call arguments in the history are JSON text of an object (vLLM chat templates)."""
    for i, message in enumerate(body.get("messages", [])):
        for call in message.get("tool_calls") or []:
            try:
                value = json.loads(call["function"]["arguments"])
            except (TypeError, ValueError):
                value = None
            if not isinstance(value, dict):
                return f"messages[{i}].tool_calls: arguments are not a JSON object"
    return None


def requires_assistant_field(name: str) -> RequestCheck:
    """Assistant messages with tool calls carry ``name`` back (DeepSeek thinking mode requires
    ``reasoning_content``)."""

    def check(body: dict[str, Any]) -> str | None:
        for i, message in enumerate(body.get("messages", [])):
            if message.get("role") == "assistant" and message.get("tool_calls"):
                if name not in message:
                    return f"messages[{i}]: missing {name} on an assistant message with tool calls"
        return None

    return check


def refuses_schema_keywords(*keywords: str) -> RequestCheck:
    """Tool parameter schemas contain none of ``keywords`` (some Gemini-compatible proxies)."""

    def found(value: Any) -> str | None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key in keywords:
                    return key
                hit = found(inner)
                if hit:
                    return hit
        if isinstance(value, list):
            for inner in value:
                hit = found(inner)
                if hit:
                    return hit
        return None

    def check(body: dict[str, Any]) -> str | None:
        for tool in body.get("tools", []):
            hit = found(tool.get("function", {}).get("parameters"))
            if hit:
                return f'Invalid JSON payload received. Unknown name "{hit}"'
        return None

    return check
