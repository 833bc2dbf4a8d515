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
"""

from __future__ import annotations

import json
import re
from collections import defaultdict, deque
from collections.abc import Collection, Sequence
from typing import Any

from planner.messages import ChatMessage, ToolCall

__all__ = ["TOOL_NAME_PATTERN", "wire_messages", "wire_tool_name"]

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
