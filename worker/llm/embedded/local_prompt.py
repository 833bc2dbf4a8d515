"""The embedded model's prompt: a conversation in the plain system / user / assistant roles of
its chat template, which has no tool role.

The tools and the JSON reply format (``worker.llm.embedded.local_grammar``) are described in the
system message; tool results are shown as user messages, with the objective repeated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from planner.llm import ToolChoice
from planner.messages import ChatMessage
from worker.llm.embedded.local_grammar import tool_function

__all__ = ["render_messages", "tools_instructions"]

_TOOL_RESULT_CHARS = 1200
"""Tool results longer than this are cut when shown to the model (its context is 2048 tokens)."""

_NEXT_STEP = "Call the tool for the next part of the objective, or answer if it is done."
"""Appended to tool results (after the objective, repeated): small models lose the thread."""


def _describe_parameters(parameters: Any) -> str:
    if not isinstance(parameters, dict):
        return "{}"
    properties = parameters.get("properties") or {}
    if not isinstance(properties, dict) or not properties:
        return "{}"
    required = set(parameters.get("required") or [])
    parts = []
    for key, prop in properties.items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        note = "" if key in required else ", optional"
        desc = prop.get("description") if isinstance(prop, dict) else None
        parts.append(f'"{key}": {kind}{note}' + (f" ({desc})" if desc else ""))
    return "{" + ", ".join(parts) + "}"


def tools_instructions(tools: Sequence[dict[str, Any]], tool_choice: ToolChoice) -> str:
    """The system-message text that describes the tools and the JSON reply format."""
    if not tools or tool_choice == "none":
        return 'Reply with JSON only: {"answer": "<your answer>"}'
    lines = ["Tools you can call:"]
    for tool in tools:
        function = tool_function(tool)
        lines.append(
            f"- {function.get('name')}: {function.get('description', '')} "
            f"Arguments: {_describe_parameters(function.get('parameters'))}"
        )
    lines.append("")
    lines.append("Reply with JSON only. To call a tool:")
    lines.append('{"tool_calls": [{"name": "<tool name>", "arguments": {...}}]}')
    if tool_choice != "required":
        lines.append('When the objective is done, reply: {"answer": "<your answer>"}')
    return "\n".join(lines)


def render_messages(
    messages: Sequence[ChatMessage],
    tools: Sequence[dict[str, Any]],
    tool_choice: ToolChoice,
) -> list[dict[str, str]]:
    """The conversation in the model's plain system / user / assistant roles.

    The leading system messages are joined with the tool instructions into one system message.
    Assistant turns are rendered in the JSON reply format (so the model sees its own format);
    consecutive tool results become one user message naming each tool; later system messages
    (reminders) stay system messages.
    """
    out: list[dict[str, str]] = []
    head: list[str] = []
    rest = list(messages)
    while rest and rest[0].role == "system":
        head.append(rest.pop(0).content or "")
    head.append(tools_instructions(tools, tool_choice))
    out.append({"role": "system", "content": "\n\n".join(h for h in head if h)})

    names: dict[str, str] = {}
    pending_results: list[str] = []
    objective = next((m.content for m in rest if m.role == "user" and m.content), None)

    def flush_results() -> None:
        if pending_results:
            text = "Tool results:\n" + "\n".join(pending_results)
            if objective:
                text += f"\n\nObjective: {objective}"
            if not tools or tool_choice == "none":
                text += "\nAnswer now."
            elif tool_choice != "required":
                text += f"\n{_NEXT_STEP}"
            out.append({"role": "user", "content": text})
            pending_results.clear()

    for message in rest:
        if message.role == "tool":
            name = names.get(message.tool_call_id or "", "tool")
            content = message.content or ""
            if len(content) > _TOOL_RESULT_CHARS:
                content = content[:_TOOL_RESULT_CHARS] + "… (cut)"
            pending_results.append(f"- {name}: {content}")
            continue
        flush_results()
        if message.role == "assistant":
            if message.tool_calls:
                for call in message.tool_calls:
                    names[call.id] = call.name
                calls = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
                text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            else:
                text = json.dumps({"answer": message.content or ""}, ensure_ascii=False)
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": message.role, "content": message.content or ""})
    flush_results()
    return out
