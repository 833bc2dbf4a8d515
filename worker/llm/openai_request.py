"""The conversation as an OpenAI-compatible endpoint must see it, from the stored log.

The stored log keeps what the model said (``planner.messages``); strict backends refuse some of
it when it comes back in the next request. Each rule here rewrites one kind of it, on the wire
only, the same way every round (so a request's prefix stays byte-identical for prompt caches):

* **Tool-call ids are unique within the conversation.** Some backends number calls per reply
  (``clock_now:0`` in round 1 and again in round 2) and then answer 400 to their own history.
  A call whose id was already used is sent as ``<id>-2`` (``-3``, … until unused), and the
  tool result answering it carries the same new id. Within one assistant turn the n-th result
  for an id answers the n-th call with that id, so repeats inside one reply work too.
* **Tool names are valid names.** A name the model invented that the API's pattern
  ``^[a-zA-Z0-9_-]{1,64}$`` refuses (``multi_tool_use.parallel``) is sent with every other
  character replaced by ``_``, cut to 64; if that would be a registered tool's name it is
  prefixed ``invalid_`` so the model does not read its own error as that tool's failure.
  (Its tool result, an "unknown tool" error, is made by ``planner.execution``.)
* **Arguments are JSON text of an object.** Arguments that could not be decoded are sent as
  ``{}``; their raw text stays in the stored log and the error result tells the model.
* **Provider fields go back where they came from.** ``provider_fields`` of an assistant
  message and its tool calls (e.g. DeepSeek's ``reasoning_content``, which DeepSeek requires
  back on a message with tool calls) are sent only to the endpoint that produced them
  (``ReplyInfo.endpoint``), since another endpoint may refuse fields it does not know.

And the body's bytes (``encode_body``; ``request_text`` with a ``ToolDefinitions``: the same
text, each ``ToolSpec``'s definition encoded once per endpoint instead of in every request).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict, deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

from planner.llm import OpenAIFunction
from planner.messages import ChatMessage, ToolCall

__all__ = [
    "TOOLS_HERE",
    "TOOL_NAME_PATTERN",
    "ToolDefinitions",
    "encode_body",
    "encode_text",
    "request_text",
    "wire_messages",
    "wire_tool_name",
]

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Function names the Chat Completions API accepts (its ``tools[].function.name`` rule)."""

_INVALID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def wire_messages(
    messages: Sequence[ChatMessage], *, endpoint: str | None, tool_names: Collection[str] = ()
) -> list[dict[str, Any]]:
    """``messages`` in the Chat Completions request format, rewritten as the module says.

    Args:
        messages: the conversation (stored log plus this request's reminders).
        endpoint: the name of the endpoint the request goes to; provider fields recorded for
            another endpoint are left out.
        tool_names: the registered tool names (for the ``invalid_`` prefix).
    """
    used_ids: set[str] = set()
    answering: dict[str, deque[str]] = defaultdict(deque)  # provider id -> wire ids, this turn
    out: list[dict[str, Any]] = []
    for message in messages:
        wire: dict[str, Any] = {"role": message.role}
        if message.role == "assistant" and message.tool_calls:
            answering = defaultdict(deque)
            calls = []
            for call in message.tool_calls:
                wire_id = _unused(call.id, used_ids)
                used_ids.add(wire_id)
                answering[call.id].append(wire_id)
                calls.append(_wire_call(call, wire_id, tool_names, message, endpoint))
            wire["content"] = message.content
            wire["tool_calls"] = calls
        else:
            wire["content"] = message.content or ""
        if message.role == "tool":
            call_id = message.tool_call_id or ""
            pending = answering.get(call_id)
            wire["tool_call_id"] = pending.popleft() if pending else call_id
        if message.role == "assistant" and _same_endpoint(message, endpoint):
            wire = {**message.provider_fields, **wire}
        out.append(wire)
    return out


def wire_tool_name(name: str, tool_names: Collection[str] = ()) -> str:
    """``name`` if the API accepts it, else a valid stand-in (see the module docstring)."""
    if TOOL_NAME_PATTERN.match(name):
        return name
    fixed = _INVALID_CHARS.sub("_", name)[:64] or "invalid_tool_name"
    if fixed in tool_names:
        fixed = f"invalid_{fixed}"[:64]
    return fixed


def _wire_call(
    call: ToolCall,
    wire_id: str,
    tool_names: Collection[str],
    message: ChatMessage,
    endpoint: str | None,
) -> dict[str, Any]:
    arguments = "{}" if call.raw_arguments is not None else _json(call.arguments)
    wire = {
        "id": wire_id,
        "type": "function",
        "function": {"name": wire_tool_name(call.name, tool_names), "arguments": arguments},
    }
    if _same_endpoint(message, endpoint):
        wire = {**call.provider_fields, **wire}
    return wire


def _unused(call_id: str, used: set[str]) -> str:
    if call_id not in used:
        return call_id
    n = 2
    while f"{call_id}-{n}" in used:
        n += 1
    return f"{call_id}-{n}"


def _same_endpoint(message: ChatMessage, endpoint: str | None) -> bool:
    produced_by = message.reply_info.endpoint if message.reply_info is not None else None
    return produced_by is None or produced_by == endpoint


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- the body's bytes ---------------------------------------------------------------------

_SURROGATES = re.compile("[\ud800-\udfff]")

TOOLS_HERE = object()
"""The value ``request_text`` writes the tool definitions' text in place of."""

MAX_KEPT_DEFINITIONS = 256
"""Tool definitions whose encoding a ``ToolDefinitions`` keeps."""


def encode_body(body: dict[str, Any]) -> bytes:
    """``body`` as UTF-8 JSON. Lone UTF-16 surrogates (a model or a tool can produce them; UTF-8
    cannot encode them) become U+FFFD instead of failing the request."""
    return encode_text(_json(body))


def encode_text(text: str) -> bytes:
    """``text`` in UTF-8, a lone surrogate written as U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


def request_text(body: dict[str, Any], tools: Callable[[], str]) -> str:
    """``json.dumps(body, ensure_ascii=False)`` with ``tools()`` written where a value is
    ``TOOLS_HERE`` (the same text when ``tools()`` is that value's encoding). The keys must be
    plain ASCII names (the body's own: ``messages``, ``model``, ``tools``, …)."""
    parts = []
    for key, value in body.items():
        text = tools() if value is TOOLS_HERE else _json(value)
        parts.append(f'"{key}": {text}')
    return "{" + ", ".join(parts) + "}"


class ToolDefinitions:
    """The JSON text of tool definitions as one endpoint sends them, each ``ToolSpec``'s made
    once: a tool ``{"type": "function", "function": f}`` whose ``f`` is an ``OpenAIFunction``
    (a spec's, never changed) encoded before on the same ``basis`` (what the endpoint's
    rewriting depends on: its schema dialect and stripped keywords) is written as it was
    then; any other tool dict is encoded every time. At most ``MAX_KEPT_DEFINITIONS`` are
    kept (then all are dropped and made again)."""

    def __init__(self) -> None:
        # by the id of the function dict, kept with it (its id cannot be another's meanwhile)
        self._kept: dict[int, tuple[OpenAIFunction, Any, str]] = {}

    def text(
        self,
        tools: Sequence[dict[str, Any]],
        basis: Any,
        wire: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> str:
        """``json.dumps([wire(tool) for tool in tools], ensure_ascii=False)``."""
        return "[" + ", ".join(self._one(tool, basis, wire) for tool in tools) + "]"

    def _one(
        self, tool: dict[str, Any], basis: Any, wire: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> str:
        function = tool.get("function")
        if (
            type(function) is not OpenAIFunction  # a definition that may change: encoded
            or len(tool) != 2
            or next(iter(tool)) != "type"  # the order the kept text has
            or tool["type"] != "function"
        ):
            return _json(wire(tool))
        known = self._kept.get(id(function))
        if known is not None and known[0] is function and known[1] == basis:
            return known[2]
        text = _json(wire(tool))
        if len(self._kept) >= MAX_KEPT_DEFINITIONS:
            self._kept.clear()
        self._kept[id(function)] = (function, basis, text)
        return text
