"""A hand-written MCP server that sends, byte for byte, what broken servers send: the core of
``mcp_stdio_server.py --mode raw`` (one message a line) and of ``FakeMcpHttpServer`` (a JSON
body, or SSE events). It imports nothing but the standard library (so the stdio script starts
fast) and nothing from mana-ai.

``replies(message)`` answers one parsed JSON-RPC message with the messages to send, each an
``Outgoing``: its bytes in chunks (made lazily: a 50 MB reply is never held whole, here or in
the test process that runs the HTTP fake) and a pause before each chunk.

Its listing (``LISTING``) holds the tools below next to junk entries, each of which must be
left out alone (``LEFT_OUT``: why, in mana-ai's words); ``GOOD_TOOLS`` are the others.

Tools:

* ``echo`` (readOnlyHint): returns ``text``.
* ``note`` (a write): returns ``noted: text``.
* ``huge`` (readOnlyHint): ``size`` characters of ``x`` as one text block, sent in 64 KiB
  chunks over ``seconds`` (0: as fast as the pipe takes them); ``id_last`` writes the reply's
  id after its result, as the TypeScript SDK does; ``is_error`` marks it as an error
  (``isError`` first, where the cut's first bytes show it).
* ``garbled`` (readOnlyHint) and ``garbled_note`` (a write): a reply the SDK's parser refuses,
  by ``kind``: ``surrogate`` (a lone ``\\ud800`` in the text), ``truncated`` (JSON that stops
  short), ``not_jsonrpc`` (JSON whose ``result`` is a number), ``no_id`` (a broken reply that
  names no request).
* ``chatty`` (readOnlyHint): a line of log text first (as servers that print to stdout do),
  then its reply ``chatted``.
* ``wrong_id`` (readOnlyHint): replies to a request id it was never sent.
* ``flood`` (readOnlyHint): ``count`` log notifications, then its reply ``flooded``.

``replies(message, version=V)`` speaks protocol version ``V``, whatever the client asks: a
version of ``MODERN_VERSIONS`` (negotiated with ``server/discover``, the SDK's
``MODERN_PROTOCOL_VERSIONS``) answers ``server/discover`` with it, and every result with what
that version requires (``resultType``; ``ttlMs`` and ``cacheScope`` on the listing), after
its content as the SDK writes it; another one answers ``initialize`` with it and refuses
``server/discover`` (method not found), as a server of that time. Without ``version`` it
echoes the version the client offers in ``initialize``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CHUNK", "GOOD_TOOLS", "LEFT_OUT", "LISTING", "MODERN_VERSIONS", "Outgoing", "replies"]

MODERN_VERSIONS = ("2026-07-28",)
"""Protocol versions negotiated with ``server/discover`` (the SDK's
``MODERN_PROTOCOL_VERSIONS``, written out: this module imports nothing but the standard
library)."""

CHUNK = 64 * 1024
_XS = b"x" * CHUNK  # one buffer for every chunk of a huge reply


@dataclass(frozen=True)
class Outgoing:
    """One message to send: its bytes in ``chunks``, ``pause_s`` seconds before each chunk
    after the first; ``reply`` is False for a notification (a JSON body carries replies)."""

    chunks: Iterable[bytes]
    pause_s: float = 0.0
    reply: bool = True


def _tool(name: str, *, read: bool = True, **properties: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "name": name,
        "description": f"The {name} tool.",
        "inputSchema": {"type": "object", "properties": properties},
    }
    if read:
        tool["annotations"] = {"readOnlyHint": True}
    return tool


STRING, NUMBER, BOOL = {"type": "string"}, {"type": "number"}, {"type": "boolean"}

LISTING: list[dict[str, Any]] = [
    _tool("echo", text=STRING),
    {"name": "broken", "inputSchema": []},  # not an object: breaks the MCP specification
    _tool("note", read=False, text=STRING),
    {"name": 42, "inputSchema": {"type": "object"}},  # a name that is not a string
    {"name": "nonsense", "inputSchema": {"type": "nonsense"}},
    _tool("huge", size=NUMBER, seconds=NUMBER, id_last=BOOL),
    {
        "name": "dangling",
        "inputSchema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    },
    _tool("garbled", kind=STRING),
    _tool("garbled_note", read=False, kind=STRING),
    {"name": "echo", "description": "A second echo.", "inputSchema": {"type": "object"}},
    _tool("chatty"),
    {"name": "bad\nname", "inputSchema": {"type": "object"}},
    {"name": "n" * 200, "inputSchema": {"type": "object"}},
    _tool("wrong_id"),
    {"name": "novel", "description": "d" * 200_000, "inputSchema": {"type": "object"}},
    _tool("flood", count=NUMBER),
]
GOOD_TOOLS = ["chatty", "echo", "flood", "garbled", "garbled_note", "huge", "note", "wrong_id"]
LEFT_OUT = [
    # taken out of the listing (the SDK would refuse the whole page for each of them)
    "tool 'broken' was left out: its entry in the tool list breaks the MCP specification "
    "(inputSchema: Input should be a valid dictionary)",
    "tool without a usable name was left out: its entry in the tool list breaks the MCP "
    "specification (name: Input should be a valid string)",
    "tool 'nonsense' was left out: its entry in the tool list breaks the MCP specification "
    "(inputSchema.type: Input should be 'object')",
    # valid MCP, but no tool an agent can be given
    "tool 'dangling' was left out: its input schema has a reference '#/$defs/missing' to "
    "nothing in it",
    "tool 'echo' was left out: the server lists a tool of that name before it",
    "tool 'bad\\nname' was left out: its name holds control characters or is not valid Unicode",
    f"tool {'n' * 80!r} was left out: its name has 200 characters, more than 128 (the MCP "
    "specification's limit)",
    "tool 'novel' was left out: its description has 200000 characters, more than 100000",
]
"""Why each junk entry of ``LISTING`` is left out, in mana-ai's words, in listing order."""


def _message(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _result(request_id: Any, result: dict[str, Any], required: dict[str, Any]) -> Outgoing:
    """A reply with ``result`` and, after it, the fields its protocol version ``required``."""
    return Outgoing([_message({"jsonrpc": "2.0", "id": request_id, "result": result | required})])


def _text_result(request_id: Any, text: str, required: dict[str, Any]) -> Outgoing:
    return _result(request_id, {"content": [{"type": "text", "text": text}]}, required)


def _huge(
    request_id: Any,
    size: int,
    seconds: float,
    id_last: bool,
    is_error: bool,
    required: dict[str, Any],
) -> Outgoing:
    rid = json.dumps(request_id).encode()
    first = b'"isError":true,' if is_error else b""
    content = b'{"content":[{"type":"text","text":"'
    after = b"".join(b"," + _message({k: v})[1:-1] for k, v in required.items())
    if id_last:
        start = b'{"result":' + content.replace(b"{", b"{" + first, 1)
        end = b'"}]' + after + b'},"jsonrpc":"2.0","id":' + rid + b"}"
    else:
        start = b'{"jsonrpc":"2.0","id":' + rid + b',"result":'
        start += content.replace(b"{", b"{" + first, 1)
        end = b'"}]' + after + b"}}"
    full, rest = divmod(size, CHUNK)

    def chunks() -> Iterator[bytes]:
        yield start
        for _ in range(full):
            yield _XS
        yield _XS[:rest] + end

    return Outgoing(chunks(), pause_s=seconds / max(full, 1))


def _garbled(request_id: Any, kind: str) -> Outgoing:
    rid = json.dumps(request_id).encode()
    text = b'"content":[{"type":"text","text":'
    data = {
        "surrogate": b'{"jsonrpc":"2.0","id":' + rid + b',"result":{' + text + b'"a\\ud800b"}]}}',
        "truncated": b'{"jsonrpc":"2.0","id":' + rid + b',"result":{' + text + b'"cut sh',
        "not_jsonrpc": b'{"jsonrpc":"2.0","id":' + rid + b',"result":5}',
        "no_id": b'{"jsonrpc":"2.0","result":{' + text + b'"a\\ud800b"}]}}',
    }[kind]
    return Outgoing([data])


def replies(message: dict[str, Any], *, version: str | None = None) -> list[Outgoing]:
    """What the server sends for ``message`` (nothing for a notification or a reply),
    speaking protocol ``version`` (see the module docstring)."""
    if "id" not in message or "method" not in message:
        return []
    request_id, method = message["id"], message["method"]
    params = message.get("params") or {}
    modern = version in MODERN_VERSIONS
    required: dict[str, Any] = {"resultType": "complete"} if modern else {}
    if method == "server/discover" and modern:
        result = {
            "supportedVersions": [version],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
        return [_result(request_id, result, {"ttlMs": 0, "cacheScope": "private", **required})]
    if method == "initialize":
        result = {
            "protocolVersion": version or params.get("protocolVersion"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
        return [_result(request_id, result, {})]
    if method == "tools/list":
        listed = {"ttlMs": 0, "cacheScope": "private", **required} if modern else {}
        return [_result(request_id, {"tools": LISTING}, listed)]
    if method == "ping":
        return [_result(request_id, {}, required)]
    if method != "tools/call":
        error = {"code": -32601, "message": f"method not found: {method}"}
        return [Outgoing([_message({"jsonrpc": "2.0", "id": request_id, "error": error})])]
    name, args = params.get("name"), params.get("arguments") or {}
    if name == "echo":
        return [_text_result(request_id, str(args.get("text", "")), required)]
    if name == "note":
        return [_text_result(request_id, f"noted: {args.get('text', '')}", required)]
    if name == "huge":
        size, seconds = int(args.get("size", 1_000_000)), float(args.get("seconds", 0))
        id_last, is_error = bool(args.get("id_last")), bool(args.get("is_error"))
        return [_huge(request_id, size, seconds, id_last, is_error, required)]
    if name in ("garbled", "garbled_note"):
        return [_garbled(request_id, str(args.get("kind", "surrogate")))]
    if name == "chatty":
        log_line = Outgoing([b"raw server: working on it..."], reply=False)
        return [log_line, _text_result(request_id, "chatted", required)]
    if name == "wrong_id":
        return [_text_result(987_654, "an answer to nobody", required)]
    if name == "flood":
        note = {"method": "notifications/message", "params": {"level": "info", "data": "."}}
        flood = [
            Outgoing([_message({"jsonrpc": "2.0", **note})], reply=False)
            for _ in range(int(args.get("count", 1000)))
        ]
        return [*flood, _text_result(request_id, "flooded", required)]
    error = {"code": -32602, "message": f"unknown tool {name}"}
    return [Outgoing([_message({"jsonrpc": "2.0", "id": request_id, "error": error})])]
