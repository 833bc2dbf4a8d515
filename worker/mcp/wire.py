"""How mana-ai reads the messages of an agent's MCP server: each one within a byte limit, cut
while it is read, and a message the SDK could not take turned into one it can (pure: no I/O;
the transports in ``worker.mcp.stdio`` and ``worker.mcp.http`` feed it their bytes).

Limits (``WireLimits``), counted in bytes of one JSON-RPC message as it comes in:

* a reply to ``tools/call``: ``RESULT_BYTES_PER_CHAR`` (6) times ``MANA_AI_MCP_MAX_RESULT_CHARS``
  + ``RESULT_HEADROOM_BYTES`` (64 KiB). Six bytes is the longest JSON escape of a character
  (``\\u00e9``), so a result of that many characters fits however its server escapes it; the
  headroom is for the envelope, ``_meta``, a second copy as structured content. The result is
  then cut to the exact number of characters as before (``worker.mcp.translate``);
* any other message (a page of the tool list, the handshake, a notification):
  ``MAX_MESSAGE_BYTES`` (4 MiB), or the call limit when that is larger.

A message past its limit is not read further: its first ``limit`` bytes are kept (and its last
``TAIL_BYTES``, where its id may be), the rest is dropped as it arrives, so memory never grows
with what the peer sends. What the SDK then gets (``cut_message``):

* a tool result (its first bytes show ``result.content`` …): the text its first bytes hold,
  as a result marked with ``CUT_META_KEY`` that ``translate.result_value`` shows with a note
  saying it was cut (``cut_result``: the SDK's ``CallToolResult`` with the fields its first
  bytes hold whole, valid under every protocol version the SDK speaks, ``resultType``
  included). The model gets the start of the result, as it does for a long result
  that fits: what it asked for is there, and it can ask for less. The cut result is sent as
  ``isError`` (so the SDK does not check a structured content it cannot see whole against
  the tool's output schema); ``result_value`` tells it apart by its mark;
* another reply: an error reply for its request ("larger than … it was not read");
* a notification or a request of the server: dropped (logged).

A complete message the SDK's parser refuses (not JSON, a lone UTF-16 surrogate such as
``\\ud800``, JSON that is not JSON-RPC; ``read_message``): when it names its request (its
``id``, read leniently), an error reply for that request, so the call fails at once instead
of waiting for its timeout; when it names none, an error reply with ``id: null`` (JSON-RPC's
own "the id could not be read"), which ``worker.mcp.guard`` turns into a failure of every
request in flight on the session. Text that does not start like a JSON object (a server's log
line on stdout) is skipped, as it answers nothing. Every error made here carries
``LOST_REPLY_DATA`` in its ``data``: its call may have run on the server (for a write: its
outcome is unknown).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import mcp.types as types
import pydantic_core
from mcp.shared.dispatcher import as_request_id
from pydantic import ValidationError

__all__ = [
    "CUT_META_KEY",
    "LOST_REPLY_DATA",
    "MAX_MESSAGE_BYTES",
    "RESULT_BYTES_PER_CHAR",
    "RESULT_HEADROOM_BYTES",
    "TAIL_BYTES",
    "MessageBuffer",
    "WireLimits",
    "cut_message",
    "cut_result",
    "encode",
    "is_lost_reply",
    "looks_like_call_result",
    "lost_reply",
    "read_message",
]

RESULT_BYTES_PER_CHAR = 6
"""Bytes of a ``tools/call`` reply per character of ``MANA_AI_MCP_MAX_RESULT_CHARS``."""
RESULT_HEADROOM_BYTES = 64 * 1024
"""Bytes of a ``tools/call`` reply beyond its characters (envelope, ``_meta``, other blocks)."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Bytes of any other message at most (a tool list page of 128 tools with 30 KB schemas)."""
TAIL_BYTES = 256
"""Bytes kept from the end of a message that was cut (a server may write its id last)."""
CUT_META_KEY = "mana-ai/cut"
"""``_meta`` key of a result cut while it was read: ``{"limit_bytes": int, "is_error": bool}``
(``is_error``: the server marked it as an error, when its first bytes said so)."""
LOST_REPLY_DATA = {"mana-ai/reply-lost": True}
"""``data`` of an error made by mana-ai for a reply it could not read or match."""

_EXCERPT_CHARS = 120
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,20}|"(?:[^"\\\x00-\x1f]|\\.){0,200}")')
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*\\u(?:d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|d[c-f][0-9a-f]{2})",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class WireLimits:
    """Bytes of one incoming message at most (see the module docstring).

    Attributes:
        call_bytes: of a reply to ``tools/call``.
        message_bytes: of any other message; at least ``call_bytes``.
    """

    call_bytes: int
    message_bytes: int

    @classmethod
    def for_result_chars(cls, max_result_chars: int) -> WireLimits:
        """The limits for ``MANA_AI_MCP_MAX_RESULT_CHARS`` = ``max_result_chars``."""
        call = RESULT_BYTES_PER_CHAR * max_result_chars + RESULT_HEADROOM_BYTES
        return cls(call_bytes=call, message_bytes=max(MAX_MESSAGE_BYTES, call))


MessageKind = Literal["call", "other", "any"]
"""What a message is known to be before it is read: a reply to ``tools/call`` (limit
``call_bytes``), something else (``message_bytes``), or not known (``any``: ``call_bytes``
when its first ``call_bytes`` look like a tool result, else ``message_bytes``)."""


class MessageBuffer:
    """One message's bytes as they arrive, in parts of any size: the first ``limit`` of them,
    how many there were (``size``), and the last ``TAIL_BYTES`` once it passed its limit."""

    def __init__(self, limits: WireLimits, kind: MessageKind) -> None:
        self._limits = limits
        self._probe = kind == "any"
        self.limit = limits.call_bytes if kind == "call" else limits.message_bytes
        self._head = bytearray()
        self._tail = b""
        self.size = 0
        self.over = False

    @property
    def head(self) -> bytes:
        """The bytes kept: the whole message, or its first ``limit`` bytes when ``over``."""
        return bytes(self._head)

    @property
    def tail(self) -> bytes:
        """The last ``TAIL_BYTES`` read past the limit (empty while not ``over``)."""
        return self._tail

    def add(self, data: bytes) -> bool:
        """Append ``data``; ``True`` once: when it made the message pass its limit."""
        self.size += len(data)
        if self.over:
            self._keep_tail(data)
            return False
        if self._probe and len(self._head) + len(data) > self._limits.call_bytes:
            self._probe = False
            room = self._limits.call_bytes - len(self._head)
            if looks_like_call_result(bytes(self._head) + data[:room]):
                self.limit = self._limits.call_bytes
        room = self.limit - len(self._head)
        if len(data) <= room:
            self._head += data
            return False
        self._head += data[:room]
        self.over = True
        self._keep_tail(data[room:])
        return True

    def _keep_tail(self, data: bytes) -> None:
        self._tail = (self._tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]


def encode(message: types.JSONRPCMessage) -> bytes:
    """``message`` as the SDK writes it (JSON, no newline)."""
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode()


def lost_reply(request_id: types.RequestId | None, code: int, message: str) -> types.JSONRPCError:
    """An error reply made by mana-ai for ``request_id`` (``None``: for no request it could
    tell; see the module docstring)."""
    error = types.ErrorData(code=code, message=message, data=dict(LOST_REPLY_DATA))
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


def is_lost_reply(data: Any) -> bool:
    """True for the ``data`` of an error ``lost_reply`` made."""
    return isinstance(data, dict) and data.get("mana-ai/reply-lost") is True


def read_message(data: bytes) -> tuple[types.JSONRPCMessage | None, str | None]:
    """A whole message (one line, one body, one event's data) as the SDK can take it:
    ``(message, None)`` when it is valid JSON-RPC; ``(error reply, why)`` when it is a reply
    (or a message naming no request) that the SDK's parser refuses; ``(None, why)`` for what
    answers nothing (blank, not a JSON object, a broken notification or request)."""
    try:
        return types.jsonrpc_message_adapter.validate_json(data, by_name=False), None
    except ValidationError as exc:
        error = exc
    stripped = data.strip()
    if not stripped:
        return None, None
    if not stripped.startswith(b"{"):
        return None, f"skipped a line that is not a JSON-RPC message: {_excerpt(stripped)}"
    try:
        parsed: Any = json.loads(data)  # lenient: takes lone surrogates, finds the id
    except ValueError:
        parsed = None
    why = _why_unreadable(data, parsed, error)
    if isinstance(parsed, dict):
        if "method" in parsed:
            method = str(parsed["method"])[:80]
            return None, f"dropped a {method!r} message that is not valid JSON-RPC ({why})"
        request_id = as_request_id(parsed.get("id"))
    else:
        request_id = _find_id(data[:4096], last=False)
    reply = lost_reply(request_id, types.PARSE_ERROR, f"its reply could not be read: it is {why}")
    return reply, f"a reply it sent could not be read ({why}): {_excerpt(stripped)}"


def looks_like_call_result(head: bytes) -> bool:
    """True when the first bytes of a message show a reply with a tool result."""
    result = _partial(head).get("result")
    return isinstance(result, dict) and bool(
        result.keys() & {"content", "structuredContent", "isError"}
    )


def cut_message(
    head: bytes,
    *,
    limit: int,
    tail: bytes = b"",
    request_id: types.RequestId | None = None,
) -> tuple[types.JSONRPCMessage | None, str]:
    """What the SDK gets for a message that passed its ``limit`` (see the module docstring),
    from its first bytes ``head`` and, when its end was read, its last bytes ``tail``;
    ``request_id`` is the request it answers when the transport knows it (an HTTP POST's
    request, the only call in flight), used when the message does not name one in ``head``.
    Returns ``(message or None, a line for the log)``."""
    partial = _partial(head)
    if "method" in partial:
        method = str(partial["method"])[:80]
        return None, f"dropped a {method!r} message of more than {limit} bytes"
    found = as_request_id(partial.get("id"))
    if found is None and tail:
        found = _find_id(tail, last=True)
    if found is None:
        found = request_id
    result = partial.get("result")
    error = partial.get("error")
    if isinstance(result, dict) and looks_like_call_result(head):
        if found is not None:
            return (
                types.JSONRPCResponse(jsonrpc="2.0", id=found, result=cut_result(result, limit)),
                f"cut a tool result of more than {limit} bytes while reading it",
            )
    elif isinstance(error, dict) and found is not None:
        code = error.get("code")
        text = str(error.get("message", ""))[:1000]
        reply = types.JSONRPCError(
            jsonrpc="2.0",
            id=found,
            error=types.ErrorData(
                code=code if isinstance(code, int) and not isinstance(code, bool) else -32603,
                message=f"{text} (an error reply of more than {limit} bytes, cut)",
            ),
        )
        return reply, f"cut an error reply of more than {limit} bytes"
    reply = lost_reply(
        found,
        types.INTERNAL_ERROR,
        f"its reply has more than {limit} bytes, the most mana-ai reads of one MCP message "
        "(MANA_AI_MCP_MAX_RESULT_CHARS for a tool result); it was not read",
    )
    return reply, f"a reply of more than {limit} bytes was not read"


_REPLACED = frozenset({"content", "structuredContent", "isError"})
"""The fields of a tool result its cut replaces (``cut_result``)."""


def cut_result(partial: dict[str, Any], limit: int) -> dict[str, Any]:
    """The tool result the SDK gets for one cut after ``limit`` bytes, whose first bytes
    hold ``partial`` (its fields in the server's order, the last one perhaps cut short).

    It is the SDK's own ``CallToolResult`` (what its server sends for every protocol version:
    ``resultType``, which 2026-07-28 requires, always serialized; older versions ignore it),
    made from the fields the first bytes hold whole (all but the last, so that nothing the
    server sent whole is lost: its ``resultType``, its ``_meta``), with the text they hold
    (``_partial_text``) as its one text block, ``isError``, and ``CUT_META_KEY`` added to its
    ``_meta``; its JSON as the SDK writes a result (by alias, without ``None``s).
    """
    cut = {"limit_bytes": limit, "is_error": partial.get("isError") is True}
    whole = {k: v for k, v in list(partial.items())[:-1] if k not in _REPLACED}
    try:
        received = types.CallToolResult.model_validate({**whole, "content": []}, by_name=False)
    except ValidationError:  # a field the SDK refuses: the server's, not kept
        received = types.CallToolResult(content=[])
    made = received.model_copy(
        update={
            "content": [types.TextContent(text=_partial_text(partial))],
            "is_error": True,
            "meta": {**(received.meta or {}), CUT_META_KEY: cut},
        }
    )
    return made.model_dump(by_alias=True, mode="json", exclude_none=True)


def _partial(head: bytes) -> dict[str, Any]:
    """``head`` (the start of a JSON object) as far as it goes; ``{}`` when it is no JSON."""
    try:
        value = pydantic_core.from_json(head, allow_partial="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _partial_text(result: dict[str, Any]) -> str:
    """The text a cut tool result holds: its text blocks (the last one's ``type`` may be
    past the cut: the SDK writes ``text`` first), else its structured content."""
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    texts = [
        b["text"]
        for b in blocks
        if isinstance(b, dict)
        and b.get("type", "text") == "text"
        and isinstance(b.get("text"), str)
    ]
    if texts:
        return "\n".join(texts)
    structured = result.get("structuredContent")
    if structured is not None:
        return json.dumps(structured, ensure_ascii=False)
    return ""


def _find_id(data: bytes, *, last: bool) -> types.RequestId | None:
    """The value of the first (or last) ``"id":`` in raw ``data``, or ``None``."""
    matches = _ID.findall(data)
    if not matches:
        return None
    try:
        return as_request_id(json.loads(matches[-1 if last else 0]))
    except ValueError:
        return None


def _why_unreadable(data: bytes, parsed: Any, error: ValidationError) -> str:
    """Why the SDK's parser refused ``data`` (``parsed``: read leniently, or ``None``), in
    words (a phrase after "it is")."""
    first = error.errors(include_url=False)[0]
    if first["type"] != "json_invalid" and isinstance(parsed, dict):
        # the union's first branch (a request) says little about a broken reply
        shape = types.JSONRPCError if "error" in parsed else types.JSONRPCResponse
        try:
            shape.model_validate(parsed, by_name=False)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "the message"
            return f"JSON but not a JSON-RPC message ({where}: {first['msg']})"
    if first["type"] == "json_invalid":
        text = data.decode("utf-8", "replace")
        lone = _LONE_SURROGATE.search(text)
        if lone is not None:
            return (
                f"JSON with a lone UTF-16 surrogate ({lone.group(0)[-6:]}), which is not "
                "valid Unicode"
            )
        return f"not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    where = ".".join(str(p) for p in first["loc"][1:]) or "the message"
    return f"JSON but not a JSON-RPC message ({where}: {first['msg']})"


def _excerpt(data: bytes) -> str:
    text = data[: _EXCERPT_CHARS * 4].decode("utf-8", "replace")
    return repr(text[:_EXCERPT_CHARS]) + ("…" if len(text) > _EXCERPT_CHARS else "")
