"""The stored message log format: ChatMessage, ToolCall, TokenUsage.

All three are frozen pydantic models. ``to_json()`` / ``from_json()`` round-trip them through
plain JSON-compatible dicts; this is the format of ``mission_iterations.messages`` and of the
archive, so it is kept stable: fields are only ever added, with defaults.

Roles and fields follow the OpenAI Chat Completions message shape (``role``, ``content``,
``tool_calls``, ``tool_call_id``), with tool-call arguments kept parsed (a dict) rather than as
a JSON string. Every text in them is storable (``Text``: NUL and lone surrogates replaced once,
as a message is made), so the call that runs is the call that is stored. The log keeps what the
model said: provider call ids and tool names as received (a provider rewrites them on the wire
when it must, see ``worker.llm.openai_request``), the raw text of arguments that could
not be decoded, and the provider-specific fields a provider needs back (``provider_fields``).
``reply_info`` records, per assistant message, which endpoint answered, why it stopped and what
it cost; it is never sent to a model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from planner.json_text import storable_json, storable_text

__all__ = [
    "ChatMessage",
    "ReplyInfo",
    "Role",
    "TokenUsage",
    "ToolCall",
    "messages_from_json",
    "messages_to_json",
]

Role = Literal["system", "user", "assistant", "tool"]

Text = Annotated[str, AfterValidator(storable_text)]
"""Text as every store holds it (``planner.json_text.storable_text``: NUL and lone
surrogates, which a model or a peer may send as JSON escapes, replaced by U+FFFD)."""
JsonObject = Annotated[dict[str, Any], AfterValidator(storable_json)]
"""A JSON object whose strings are ``Text``."""


class ToolCall(BaseModel):
    """One tool call the model asked for.

    Attributes:
        id: the provider's call id; a tool result answers it via ``ChatMessage.tool_call_id``.
            It may repeat an id of an earlier round (some providers number calls per reply).
        name: the tool name as the model wrote it (it may name no registered tool, or not even
            be a valid tool name).
        arguments: the parsed JSON arguments object.
        parse_error: set by a provider when the model's arguments were not a JSON object
            (``arguments`` is then empty); the loop answers the call with an error result.
        raw_arguments: the arguments text as the model sent it, kept when it could not be
            decoded (``parse_error`` is set); ``None`` otherwise.
        provider_fields: fields the provider put on the call beyond ``id``, ``type`` and
            ``function`` (e.g. Gemini's ``extra_content`` with a thought signature); sent back
            as received to the endpoint that produced them.
    """

    model_config = ConfigDict(frozen=True)

    id: Text
    name: Text
    arguments: JsonObject = Field(default_factory=dict)
    parse_error: Text | None = None
    raw_arguments: Text | None = None
    provider_fields: JsonObject = Field(default_factory=dict)


class TokenUsage(BaseModel):
    """Token counts as the provider reported them (``usage`` of a chat completion).

    ``estimated`` is true when some of the counts were estimated because the provider did not
    report them (see ``worker.llm.openai_reply``); a sum is estimated when any part is.
    """

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False

    @property
    def total_tokens(self) -> int:
        """prompt_tokens + completion_tokens."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        # the validator itself, not TokenUsage(...): the same value without the Python frame
        # of BaseModel.__init__ (the loop adds usage every round)
        return TokenUsage.__pydantic_validator__.validate_python(  # type: ignore[no-any-return]
            {
                "prompt_tokens": self.prompt_tokens + other.prompt_tokens,
                "completion_tokens": self.completion_tokens + other.completion_tokens,
                "estimated": self.estimated or other.estimated,
            }
        )


class ReplyInfo(BaseModel):
    """What the chat model said about one assistant message; stored, never sent to a model.

    Attributes:
        endpoint: the name of the endpoint that answered (``primary`` / ``fallback`` for the
            OpenAI-compatible provider); ``None`` for in-process models.
        finish_reason: why the model stopped, in the OpenAI vocabulary (``stop``,
            ``tool_calls``, ``length``, ``content_filter``) or as the provider said it.
        usage: the tokens this round cost, failed attempts of the same request included.
    """

    model_config = ConfigDict(frozen=True)

    endpoint: Text | None = None
    finish_reason: Text | None = None
    usage: TokenUsage | None = None


class ChatMessage(BaseModel):
    """One message of a conversation.

    Attributes:
        role: ``system`` | ``user`` | ``assistant`` | ``tool``.
        content: the text; ``None`` for an assistant message that only calls tools.
        tool_calls: on assistant messages, the calls the model issued, in its order.
        tool_call_id: on tool messages, the id of the call this result answers.
        provider_fields: on assistant messages, fields the provider put on the message beyond
            the Chat Completions ones (e.g. DeepSeek's ``reasoning_content``, OpenRouter's
            ``reasoning_details``), which some providers require back in the next request;
            sent back as received to the endpoint that produced them.
        reply_info: on assistant messages from a model, who answered and what it cost.
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: Text | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: Text | None = None
    provider_fields: JsonObject = Field(default_factory=dict)
    reply_info: ReplyInfo | None = None

    def to_json(self) -> dict[str, Any]:
        """This message as a JSON-compatible dict (empty optional fields left out; ``role``
        last)."""
        # model_dump(mode="json", exclude_defaults=True) without its Python frame and without
        # an ``exclude`` set (which costs as much as the rest): ``role`` has no default, so
        # it is always there, and is moved to the end
        data: dict[str, Any] = self.__pydantic_serializer__.to_python(
            self, mode="json", exclude_defaults=True
        )
        data["role"] = data.pop("role")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChatMessage:
        """Parse a dict written by ``to_json``. Raises ``pydantic.ValidationError``."""
        return cls.model_validate(data)


def messages_to_json(messages: Iterable[ChatMessage]) -> list[dict[str, Any]]:
    """A message log as a JSON-compatible list (the stored format)."""
    return [m.to_json() for m in messages]


def messages_from_json(data: Sequence[dict[str, Any]]) -> list[ChatMessage]:
    """Parse a stored message log. Raises ``pydantic.ValidationError`` on a malformed entry."""
    return [ChatMessage.from_json(d) for d in data]
