"""Reading a 2xx ``/chat/completions`` body, in the shapes real endpoints send.

The OpenAI reference (https://platform.openai.com/docs/api-reference/chat/object) is the
baseline; each rule below covers a kind of departure from it seen in public bug reports of
agent runtimes against vLLM, Ollama, LiteLLM, OpenRouter, DeepSeek, Gemini's compatibility
layer and Azure:

* **Errors inside a 200.** A body with an ``error`` (object or text; OpenRouter, Ollama,
  LiteLLM), a vLLM-style ``{"object": "error", …}``, a Gemini-style list holding an error, or a
  first choice with ``finish_reason: "error"`` / an ``error`` object raises ``ErrorReply``
  with the HTTP status the error stands for (``_error_status``); the client then retries or
  fails it exactly as if the endpoint had answered that status.
* **Finish reasons** are mapped to the OpenAI vocabulary (``_FINISH_REASONS``: Gemini's
  ``MAX_TOKENS``, Anthropic-style ``end_turn`` / ``tool_use``, ``SAFETY`` …); an unknown one is
  kept, lower-cased. A ``refusal`` without content counts as ``content_filter``.
* **Provider fields.** Keys of the message (and of each tool call) beyond the Chat Completions
  ones are kept in ``provider_fields`` (DeepSeek's ``reasoning_content``, OpenRouter's
  ``reasoning_details``, Gemini's ``extra_content``), empty values dropped, so that they can be
  sent back.
* **Tool calls** without an id get a generated ``call_<hex>`` one; a call without a usable name
  keeps the name ``""`` (its tool result is an error the model reads); arguments are decoded by
  ``worker.llm.tool_arguments``.
* **Usage** is read from ``usage`` (or Gemini's ``usageMetadata``) under the OpenAI, Anthropic
  (``input_tokens``) and Ollama (``prompt_eval_count``) key names; a ``total_tokens`` alone
  counts in full; counts that are missing (or all zero for a reply with text) are estimated
  at ``CHARS_PER_TOKEN`` characters per token and the usage is marked ``estimated``. Usage
  reported on an error body is kept on the error (it may be billed).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from planner.errors import LLMResponseError, PlannerError
from planner.llm import CompletionResponse
from planner.messages import ChatMessage, TokenUsage, ToolCall
from worker.llm.response_body import Answer
from worker.llm.tool_arguments import decode_arguments

__all__ = [
    "CHARS_PER_TOKEN",
    "ErrorReply",
    "body_text",
    "estimate_tokens",
    "excerpt",
    "normalize_finish_reason",
    "parse_chat_completion",
]

CHARS_PER_TOKEN = 4
"""Characters per token when estimating: OpenAI's rule of thumb for English text
(https://help.openai.com/en/articles/4936856-what-are-tokens-and-how-to-count-them)."""

EXCERPT_CHARS = 500
"""Longest body excerpt put into an error message."""

_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls"})
_RESPONSE_ONLY_KEYS = frozenset({"annotations", "audio", "function_call"})
"""Message keys of OpenAI responses that its requests do not take back."""
_CALL_KEYS = frozenset({"id", "type", "function", "index"})

_FINISH_REASONS = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "tool_calls": "tool_calls",
    "tool_use": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "model_length": "length",
    "content_filter": "content_filter",
    "content_filtered": "content_filter",
    "safety": "content_filter",
    "recitation": "content_filter",
    "blocklist": "content_filter",
    "prohibited_content": "content_filter",
    "spii": "content_filter",
    "refusal": "content_filter",
    "error": "error",
}

_ERROR_WORDS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("rate_limit", "rate limit", "resource_exhausted", "too_many_requests", "quota"), 429),
    (("overloaded", "unavailable", "capacity"), 503),
    (("timeout", "timed out", "deadline_exceeded"), 504),
    (("unauthenticated", "authentication", "invalid_api_key", "unauthorized"), 401),
    (("permission", "forbidden"), 403),
    (("not_found", "not found"), 404),
    (("context_length", "invalid_request", "invalid_argument", "bad_request"), 400),
    (("server_error", "internal"), 500),
)
"""Words in an error's ``code`` / ``status`` / ``type`` (then its message) → HTTP status."""

UNKNOWN_ERROR_STATUS = 502
"""Status of an in-body error whose kind cannot be told: a failed upstream behind a proxy,
so it is retried like any 5xx."""


class ErrorReply(PlannerError):
    """A 2xx body that reports an error instead of an answer.

    Attributes:
        status: the HTTP status the error stands for (``_error_status``).
        message: the provider's error text.
        usage: tokens the body reported (zero when none); an error can still be billed.
    """

    def __init__(self, status: int, message: str, usage: TokenUsage) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.usage = usage


def excerpt(text: str) -> str:
    """``text`` stripped and cut to ``EXCERPT_CHARS`` characters (``…`` marks a cut)."""
    text = text.strip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` at ``CHARS_PER_TOKEN`` characters per token, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def normalize_finish_reason(raw: Any) -> str | None:
    """A finish reason in the OpenAI vocabulary (see ``_FINISH_REASONS``); ``None`` if absent."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    lowered = raw.strip().lower()
    return _FINISH_REASONS.get(lowered, lowered)


def parse_chat_completion(
    response: Answer, body: bytes, *, url: str, prompt_tokens_estimate: int = 0
) -> CompletionResponse:
    """Turn a 2xx chat completion answer into a CompletionResponse (see the module docstring).

    Args:
        response: the answer (its status and headers; the body is not read from it).
        body: the answer's body, decoded (``worker.llm.response_body.read_body``).
        url: the endpoint, for error messages.
        prompt_tokens_estimate: the request's size in tokens, used when the body reports no
            prompt token count.

    Raises:
        ErrorReply: the body reports an error (inside a 200).
        LLMResponseError: the body is not JSON, has no choices or a first choice without a
            message object, or content that is neither text nor null; the message quotes up
            to 500 characters of the body. Usage the body reported is kept on the error.
    """
    data = _json_object(response, body, url)
    billed = _reported_usage(data)
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    error = _body_error(data, choice)
    if error is not None:
        raise ErrorReply(_error_status(error), _error_message(error), billed)
    if choice is None:
        raise _unusable(response, body, url, "no choices", billed)
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise _unusable(response, body, url, "a first choice without a message object", billed)
    message = choice["message"]
    finish_reason = normalize_finish_reason(choice.get("finish_reason"))
    content = _text_content(message.get("content"))
    if content is not None and not isinstance(content, str):
        raise _unusable(
            response, body, url, "a message content that is neither a string nor null", billed
        )
    content, raw_calls = _raw_calls(message, content)
    calls = tuple(_tool_call(raw, truncated=finish_reason == "length") for raw in raw_calls)
    fields = _provider_fields(message, _MESSAGE_KEYS | _RESPONSE_ONLY_KEYS)
    if fields.get("refusal") and not (content or "").strip() and not calls:
        finish_reason = "content_filter"
    reply = ChatMessage(role="assistant", content=content, tool_calls=calls, provider_fields=fields)
    return CompletionResponse(
        message=reply,
        usage=_usage(data, prompt_tokens_estimate, _completion_text(reply)),
        finish_reason=finish_reason,
        response_model=_short_text(data.get("model")),
        response_id=_short_text(data.get("id")),
    )


def _json_object(response: Answer, body: bytes, url: str) -> dict[str, Any]:
    """The body as a JSON object (a one-object list, as Gemini wraps errors, unwrapped).

    Raises:
        LLMResponseError: not JSON, nested too deeply, or not an object.
    """
    try:
        data = json.loads(body)  # as httpx's ``response.json()``: UTF-8, -16 or -32, detected
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _unusable(response, body, url, "a body that is not JSON", TokenUsage()) from None
    except RecursionError:
        raise _unusable(
            response, body, url, "JSON nested too deeply to read", TokenUsage()
        ) from None
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict):
        data = data[0]
    if not isinstance(data, dict):
        raise _unusable(response, body, url, "JSON that is not an object", TokenUsage())
    return data


def _text_content(content: Any) -> Any:
    """Content parts joined (the text ones only); any other content as it is."""
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "output_text")
        )
    return content


def _raw_calls(message: dict[str, Any], content: str | None) -> tuple[str | None, list[Any]]:
    """The message's tool calls as sent (``tool_calls``, the legacy ``function_call``, or
    ``<tool_call>`` blocks in the text, which then leave the content), and the content."""
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raw_calls = [raw_calls]
    if not raw_calls and isinstance(message.get("function_call"), dict):
        # the legacy function-calling shape (one call, no id), still sent by some servers
        raw_calls = [{"type": "function", "function": message["function_call"]}]
    if not raw_calls and content and "<tool_call>" in content:
        content, raw_calls = _text_tool_calls(content)
    return content, raw_calls


def _short_text(value: Any) -> str | None:
    """A string field of the answer as it may be recorded (traces): at most 200 characters;
    ``None`` for another type or an empty string."""
    return value[:200] if isinstance(value, str) and value else None


def body_text(response: Answer, body: bytes) -> str:
    """``body`` as text, in the charset the answer names (else UTF-8), undecodable bytes
    replaced: what httpx's ``response.text`` gives for it (``encoding`` is always a known
    codec)."""
    return body.decode(response.encoding or "utf-8", errors="replace")


def _unusable(
    response: Answer, body: bytes, url: str, what: str, usage: TokenUsage
) -> LLMResponseError:
    return LLMResponseError(
        f"LLM endpoint {url} answered {response.status_code} with {what}: "
        f"{excerpt(body_text(response, body)) or '(empty body)'}",
        usage=usage,
    )


def _body_error(data: dict[str, Any], choice: Any) -> Any:
    """The error a body reports (a non-empty ``error``, vLLM's ``"object": "error"``, or a
    first choice that ended in an error), or ``None``. An error wins over any choices."""
    if data.get("error"):
        return data["error"]
    if data.get("object") == "error":  # vLLM's error shape
        return data
    if isinstance(choice, dict):
        if choice.get("error"):
            return choice["error"]
        if normalize_finish_reason(choice.get("finish_reason")) == "error":
            return "the endpoint ended the answer with finish_reason 'error'"
    return None


def _error_status(error: Any) -> int:
    """The HTTP status an in-body error stands for: its numeric ``code`` / ``status``, else the
    first of ``_ERROR_WORDS`` in its kind (``code``, ``status``, ``type``), then its message."""
    if isinstance(error, dict):
        for key in ("code", "status", "status_code"):
            status = _as_status(error.get(key))
            if status is not None:
                return status
        kinds = " ".join(str(error.get(k) or "") for k in ("code", "status", "type"))
        texts = [kinds, _error_message(error)]
    else:
        texts = [str(error)]
    for text in texts:
        lowered = text.lower()
        for words, status in _ERROR_WORDS:
            if any(w in lowered for w in words):
                return status
    return UNKNOWN_ERROR_STATUS


def _as_status(value: Any) -> int | None:
    """``value`` as an HTTP error status (400-599; a number or numeric text), or ``None``."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
        return value
    return None


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message") or error.get("error") or error.get("detail")
        if isinstance(message, str) and message.strip():
            return excerpt(message)
        return excerpt(json.dumps(error, ensure_ascii=False, default=str))
    return excerpt(str(error))


def _tool_call(raw: Any, *, truncated: bool) -> ToolCall:
    """One ToolCall; never raises (a malformed call becomes an error result for the model)."""
    if not isinstance(raw, dict):
        text = json.dumps(raw, ensure_ascii=False, default=str)
        return ToolCall(
            id=_new_id(), name="", parse_error="the tool call is not an object", raw_arguments=text
        )
    function = raw.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name")
    call_id = raw.get("id")
    raw_arguments = function.get("arguments")
    arguments, error = decode_arguments(raw_arguments, truncated=truncated)
    kept_raw = None
    if error is not None:
        is_text = isinstance(raw_arguments, str)
        kept_raw = raw_arguments if is_text else json.dumps(raw_arguments, default=str)
    return ToolCall(
        id=call_id if isinstance(call_id, str) and call_id else _new_id(),
        name=name if isinstance(name, str) else "",
        arguments=arguments,
        parse_error=error,
        raw_arguments=kept_raw,
        provider_fields=_provider_fields(raw, _CALL_KEYS),
    )


_TEXT_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _text_tool_calls(content: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Tool calls written into the text as ``<tool_call>{"name": …, "arguments": …}
    </tool_call>`` (Hermes / Qwen chat templates, served by vLLM or Ollama without a tool-call
    parser): each block that holds such an object becomes a call and leaves the text; blocks
    that do not are left as they are."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            value = json.loads(match.group(1))
        except (ValueError, RecursionError):
            return match.group(0)
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return match.group(0)
        arguments = value.get("arguments", value.get("parameters", {}))
        calls.append(
            {"type": "function", "function": {"name": value["name"], "arguments": arguments}}
        )
        return ""

    rest = _TEXT_TOOL_CALL.sub(take, content).strip()
    return (rest or None), calls


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _provider_fields(raw: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in known and v not in (None, "", [], {})}


def _completion_text(reply: ChatMessage) -> str:
    """The text a reply's completion tokens were spent on, for estimating them."""
    parts = [reply.content or ""]
    parts += [v for v in reply.provider_fields.values() if isinstance(v, str)]
    for call in reply.tool_calls:
        parts += [call.name, call.raw_arguments or json.dumps(call.arguments)]
    return "".join(parts)


def _usage(data: dict[str, Any], prompt_estimate: int, completion_text: str) -> TokenUsage:
    """The reply's usage, estimating what it does not report (see the module docstring).

    All-zero counts for a reply that says something are placeholders (some servers and proxies
    send them), so they are estimated too.
    """
    raw = data.get("usage") or data.get("usageMetadata")
    raw = raw if isinstance(raw, dict) else {}
    prompt = _count(raw, "prompt_tokens", "input_tokens", "prompt_eval_count", "promptTokenCount")
    completion = _count(
        raw, "completion_tokens", "output_tokens", "eval_count", "candidatesTokenCount"
    )
    total = _count(raw, "total_tokens", "totalTokenCount")
    if completion_text and not any((prompt, completion, total)):
        prompt = completion = total = None
    if total is not None:  # what is billed: all of it counts, however the parts are given
        if prompt is None and completion is None:
            completion = min(estimate_tokens(completion_text), total)
        if prompt is None:
            prompt = max(0, total - (completion or 0))
        # a total above the parts counts tokens they leave out (e.g. Gemini's thinking tokens)
        completion = max(completion or 0, total - prompt)
        return TokenUsage(prompt_tokens=prompt, completion_tokens=completion)
    return TokenUsage(
        prompt_tokens=prompt if prompt is not None else prompt_estimate,
        completion_tokens=(
            completion if completion is not None else estimate_tokens(completion_text)
        ),
        estimated=prompt is None or completion is None,
    )


def _reported_usage(data: dict[str, Any]) -> TokenUsage:
    """The usage a body reports, missing counts as zero (nothing is estimated)."""
    if not (data.get("usage") or data.get("usageMetadata")):
        return TokenUsage()
    return _usage(data, 0, "").model_copy(update={"estimated": False})


MAX_REPORTED_TOKENS = 10**9
"""Largest token count believed for one request: a billion tokens is far past any model's
context; bigger (or negative, fractional, NaN) counts are a provider's bug, read as "not
reported" (then estimated) rather than stored."""


def _count(raw: dict[str, Any], *keys: str) -> int | None:
    """The first sensible whole count under ``keys`` (numbers or numeric text, 0 to
    ``MAX_REPORTED_TOKENS``), or None."""
    for key in keys:
        value = raw.get(key)
        count: int | None = None
        if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 12:
            count = int(value.strip())
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            count = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            count = value
        if count is not None and 0 <= count <= MAX_REPORTED_TOKENS:
            return count
    return None
