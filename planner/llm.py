"""The chat-model seam: ChatModel protocol, CompletionRequest, CompletionResponse.

Implementations live in ``worker.llm`` (OpenAI-compatible HTTP, embedded local model)
and ``planner.testing`` (scripted fakes). A ChatModel raises only ``planner.errors.LLMError``
subclasses for failures the operator should see.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from planner.messages import ChatMessage, TokenUsage

__all__ = ["ChatModel", "CompletionRequest", "CompletionResponse", "OpenAIFunction", "ToolChoice"]

ToolChoice = Literal["auto", "required", "none"]


class OpenAIFunction(dict[str, Any]):
    """A ``ToolSpec``'s definition in the OpenAI format (``name``, ``description``,
    ``parameters``), made once per spec and never changed: a provider may keep what it made
    of one (its encoding) for as long as it holds it. Anywhere else, the plain dict it is."""

    __slots__ = ()


class CompletionRequest(BaseModel):
    """One chat completion request.

    Attributes:
        messages: the conversation as sent (reminders included, for this request only).
        tools: tool definitions in the OpenAI ``tools`` format
            (``{"type": "function", "function": {"name", "description", "parameters"}}``).
        model: the model name; ``None`` lets the provider use its configured default.
        temperature: sampling temperature; ``None`` = provider default.
        max_tokens: cap on completion tokens; ``None`` = provider default.
        tool_choice: ``auto`` (default), ``required`` or ``none``, as in the OpenAI API.
    """

    model_config = ConfigDict(frozen=True)

    messages: list[ChatMessage]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: ToolChoice = "auto"


class CompletionResponse(BaseModel):
    """The model's answer: one assistant message, the usage it cost, and why it stopped.

    Attributes:
        message: the assistant message.
        usage: tokens the request cost, failed attempts of it included.
        finish_reason: why the model stopped, in the OpenAI vocabulary (``stop``,
            ``tool_calls``, ``length``, ``content_filter``, ``error``) or as the provider said
            it; ``None`` when it did not say. ``planner.replies`` decides what each means.
        endpoint: the name of the endpoint that answered (``None`` for in-process models).
        response_model: the model the answer says produced it (the body's ``model``, at most
            200 characters; ``None`` when it names none): what served the request, which may
            differ from the model asked for (an alias, a fallback).
        response_id: the answer's own id (the body's ``id``, at most 200 characters).
    """

    model_config = ConfigDict(frozen=True)

    message: ChatMessage
    usage: TokenUsage = TokenUsage()
    finish_reason: str | None = None
    endpoint: str | None = None
    response_model: str | None = None
    response_id: str | None = None


@runtime_checkable
class ChatModel(Protocol):
    """Anything that turns a CompletionRequest into a CompletionResponse.

    Raises:
        planner.errors.LLMError: the model could not answer usably (after the
            implementation's own retries, if it has any).
    """

    async def complete(self, request: CompletionRequest) -> CompletionResponse: ...
