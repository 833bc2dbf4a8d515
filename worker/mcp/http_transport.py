"""The HTTP transport under the SDK's streamable HTTP client of an agent's MCP server: every
response body is read within the limits of ``worker.mcp.wire``, while it comes in.

The SDK reads a JSON response whole (``response.aread()``) and an SSE event whole before it
parses it. Its documented seam is the ``httpx2.AsyncClient`` it is given (``http_client=``);
this ``BoundedTransport`` is that client's transport, wrapping the real one:

* each request asks for an uncompressed answer (``Accept-Encoding: identity``); a server that
  compresses anyway is inflated here, in bounded steps (gzip and zlib; other encodings reach
  the SDK as they are, and fail as unreadable), so a small body cannot grow past the limit;
* the limit of a response is ``call_bytes`` when its POST is a ``tools/call``, else
  ``message_bytes``;
* a JSON body (status below 400) is read up to its limit: past it, what ``wire.cut_message``
  makes of its first bytes replaces it (for the POST's request) and the connection is closed
  at once: a slow 50 MB result is cut as soon as its first bytes are in. A whole body that is
  not valid JSON-RPC becomes an error reply for the POST's request (``wire.read_message``);
* an SSE body is re-framed event by event (lines end with ``\\n`` or ``\\r\\n``; a bare
  ``\\r`` is not taken as a line end): an event's data past the limit is cut like a body
  (a reply: the stream ends after it; a notification: that event is dropped), a garbled one
  becomes an error reply, field lines (``event``, ``id``, ``retry``) pass as they are, and
  longer than ``FIELD_LINE_BYTES`` are dropped, as are comments;
* an error status (400 and up) answering a POST of a request becomes a JSON-RPC error reply
  to it that says the status: the SDK would otherwise answer "Server returned an error
  response" (MCP error -32603) for any status but 404, so a 401 (a token refused) could not
  be told from a 500. Its message is ``HTTP 401 Unauthorized`` and what the body said (its
  JSON-RPC error's message, or the first ``ERROR_EXCERPT_CHARS`` of its text, read within
  ``ERROR_BODY_BYTES``); its code is the body's JSON-RPC error code, else the SDK's for that
  status (-32601 for a 404 before a session, -32600 after, -32603 otherwise). Other error
  bodies are only cut at ``message_bytes``.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Literal

import httpx2
import mcp.types as types
from mcp.shared.dispatcher import as_request_id

from worker.mcp.wire import (
    MessageBuffer,
    WireLimits,
    cut_message,
    encode,
    is_lost_reply,
    lost_reply,
    read_message,
)

__all__ = [
    "ERROR_BODY_BYTES",
    "ERROR_EXCERPT_CHARS",
    "FIELD_LINE_BYTES",
    "BoundedTransport",
    "SseFramer",
]

logger = logging.getLogger(__name__)

FIELD_LINE_BYTES = 8 * 1024
"""Bytes of an SSE line other than ``data`` at most (an ``id``, an ``event``, a comment)."""
ERROR_BODY_BYTES = 64 * 1024
"""Bytes of an error status's body read for its text at most."""
ERROR_EXCERPT_CHARS = 200
"""Characters of an error body's text quoted at most."""
_INFLATE_BYTES = 64 * 1024
_DROPPED_HEADERS = frozenset({"content-length", "content-encoding"})

_Kind = Literal["call", "other"]


class BoundedTransport(httpx2.AsyncBaseTransport):
    """See the module docstring.

    Args:
        limits: bytes of one incoming message at most.
        server: the server as logs name it (no secrets).
        inner: the transport that talks HTTP (default: ``httpx2.AsyncHTTPTransport()``).
    """

    def __init__(
        self,
        limits: WireLimits,
        *,
        server: str = "",
        inner: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._limits = limits
        self._server = server
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        kind, request_id = _what_it_asks(request)
        response = await self._inner.handle_async_request(request)
        source: httpx2.AsyncByteStream = response.stream  # type: ignore[assignment]
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            source = _Inflated(source)
        content_type = response.headers.get("content-type", "").lower()
        stream: httpx2.AsyncByteStream
        if response.status_code >= 400 and request_id is not None:
            return await _status_reply(request, response, source, request_id)
        if response.status_code >= 400:
            stream = _Truncated(source, self._limits.message_bytes)
        elif content_type.startswith("text/event-stream"):
            framer = SseFramer(self._limits, kind, request_id, server=self._server)
            stream = _Framed(source, framer)
        elif content_type.startswith("application/json"):
            stream = _JsonBody(source, self._limits, kind, request_id, self._server)
        else:
            stream = _Truncated(source, self._limits.message_bytes)
        headers = [
            (k, v) for k, v in response.headers.multi_items() if k.lower() not in _DROPPED_HEADERS
        ]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            stream=stream,
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _status_reply(
    request: httpx2.Request,
    response: httpx2.Response,
    source: httpx2.AsyncByteStream,
    request_id: types.RequestId,
) -> httpx2.Response:
    """The error status ``response`` to the POST of request ``request_id`` as a JSON-RPC error
    reply that says the status (see the module docstring)."""
    status = response.status_code
    body = bytearray()
    try:
        async for chunk in _Truncated(source, ERROR_BODY_BYTES):
            body += chunk
    except httpx2.HTTPError:
        pass  # what came is enough for the status
    finally:
        await source.aclose()
    said, code, data = _error_text(bytes(body)), None, None
    message, _ = read_message(bytes(body))
    if isinstance(message, types.JSONRPCError) and not is_lost_reply(message.error.data):
        said, code, data = message.error.message, message.error.code, message.error.data
    if code is None and status == 404:
        in_session = "mcp-session-id" in request.headers
        code = types.INVALID_REQUEST if in_session else types.METHOD_NOT_FOUND
    text = f"HTTP {status} {httpx2.codes.get_reason_phrase(status)}".strip()
    if said:
        text += f": {said[:ERROR_EXCERPT_CHARS]}"
    error = types.ErrorData(
        code=types.INTERNAL_ERROR if code is None else code, message=text, data=data
    )
    reply = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
    return httpx2.Response(
        status,
        headers=[("content-type", "application/json")],
        content=encode(reply),
        request=request,
        extensions=response.extensions,
    )


def _error_text(body: bytes) -> str:
    """An error body's text on one line (what a proxy or a framework's error page says)."""
    return " ".join(body.decode("utf-8", errors="replace").split())[:ERROR_EXCERPT_CHARS]


def _what_it_asks(request: httpx2.Request) -> tuple[_Kind, types.RequestId | None]:
    """Whether ``request`` is a ``tools/call``, and the id of the JSON-RPC request it POSTs."""
    if request.method != "POST":
        return "other", None
    try:
        body = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return "other", None
    if not isinstance(body, dict) or "method" not in body:
        return "other", None
    kind: _Kind = "call" if body["method"] == "tools/call" else "other"
    return kind, as_request_id(body.get("id"))


class _Inflated(httpx2.AsyncByteStream):
    """A gzip or zlib body, inflated ``_INFLATE_BYTES`` at a time (it ends where the data
    stops making sense: what came so far is then judged as the body)."""

    def __init__(self, source: httpx2.AsyncByteStream) -> None:
        self._source = source

    async def __aiter__(self) -> AsyncIterator[bytes]:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)
        async for chunk in self._source:
            data = chunk
            while data:
                try:
                    out = inflater.decompress(data, _INFLATE_BYTES)
                except zlib.error:
                    return
                if out:
                    yield out
                data = inflater.unconsumed_tail

    async def aclose(self) -> None:
        await self._source.aclose()


class _Truncated(httpx2.AsyncByteStream):
    """A body cut after ``limit`` bytes."""

    def __init__(self, source: httpx2.AsyncByteStream, limit: int) -> None:
        self._source = source
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left = self._limit
        try:
            async for chunk in self._source:
                yield chunk[:left]
                left -= len(chunk)
                if left <= 0:
                    return
        finally:
            await self._source.aclose()

    async def aclose(self) -> None:
        await self._source.aclose()


class _JsonBody(httpx2.AsyncByteStream):
    """One JSON-RPC message as a body, within its limit (see the module docstring)."""

    def __init__(
        self,
        source: httpx2.AsyncByteStream,
        limits: WireLimits,
        kind: _Kind,
        request_id: types.RequestId | None,
        server: str,
    ) -> None:
        self._source = source
        self._limits = limits
        self._kind = kind
        self._request_id = request_id
        self._server = server

    async def __aiter__(self) -> AsyncIterator[bytes]:
        buffer = MessageBuffer(self._limits, self._kind)
        try:
            async for chunk in self._source:
                if buffer.add(chunk):
                    message, note = cut_message(
                        buffer.head, limit=buffer.limit, request_id=self._request_id
                    )
                    logger.warning("MCP server %s: %s", self._server, note)
                    if message is not None:
                        yield encode(_for_request(message, self._request_id))
                    return
        finally:
            await self._source.aclose()
        body = buffer.head
        message, problem = read_message(body)
        if message is not None and not _unreadable(message):
            yield body
            return
        logger.warning("MCP server %s: %s", self._server, problem)
        if message is None:
            if self._request_id is None:
                return
            message = lost_reply(
                self._request_id, types.PARSE_ERROR, f"its reply could not be read: {problem}"
            )
        yield encode(_for_request(message, self._request_id))

    async def aclose(self) -> None:
        await self._source.aclose()


class _Framed(httpx2.AsyncByteStream):
    """An SSE body through an ``SseFramer``."""

    def __init__(self, source: httpx2.AsyncByteStream, framer: SseFramer) -> None:
        self._source = source
        self._framer = framer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._source:
                out = self._framer.feed(chunk)
                if out:
                    yield out
                if self._framer.done:
                    return
        finally:
            await self._source.aclose()

    async def aclose(self) -> None:
        await self._source.aclose()


class SseFramer:
    """SSE bytes in, in parts of any size; the same events out, each message within its
    limit (see the module docstring).

    Args:
        limits: bytes of one message at most.
        kind: ``call`` when the stream answers a ``tools/call``.
        request_id: the request of the POST whose stream this is (``None``: the GET stream).
        server: the server as logs name it.

    Attributes:
        done: the reply of the POST was handed on cut; nothing more is read.
    """

    def __init__(
        self,
        limits: WireLimits,
        kind: _Kind,
        request_id: types.RequestId | None,
        *,
        server: str = "",
    ) -> None:
        self._limits = limits
        self._kind = kind
        self._request_id = request_id
        self._server = server
        self.done = False
        # the line being read: its first bytes until they tell its field, then what it is
        self._start = bytearray()
        self._line_kind: Literal["data", "field"] | None = None
        self._field = bytearray()
        self._held_cr = False  # a data line's part ended with \r: a line end, or data?
        # the event being read
        self._fields: list[bytes] = []
        self._data: MessageBuffer | None = None
        self._skip_event = False

    def feed(self, data: bytes) -> bytes:
        """The bytes to pass on for ``data``."""
        out = bytearray()
        start = 0
        while not self.done:
            end = data.find(b"\n", start)
            part = data[start:] if end < 0 else data[start:end]
            if part:
                self._line_part(part, out)
            if end < 0:
                break
            self._line_end(out)
            start = end + 1
        return bytes(out)

    def _line_part(self, part: bytes, out: bytearray) -> None:
        if self._line_kind == "data":
            self._data_part(part, out)
        elif self._line_kind == "field":
            if len(self._field) <= FIELD_LINE_BYTES:
                self._field += part[: FIELD_LINE_BYTES + 1 - len(self._field)]
        else:
            self._start += part
            if len(self._start) >= len(b"data: "):
                start = bytes(self._start)
                self._start.clear()
                if start.startswith(b"data:"):
                    self._line_kind = "data"
                    self._data_line(start.removeprefix(b"data:").removeprefix(b" "), out)
                else:
                    self._line_kind = "field"
                    self._field = bytearray(start[: FIELD_LINE_BYTES + 1])

    def _line_end(self, out: bytearray) -> None:
        kind, self._line_kind, self._held_cr = self._line_kind, None, False
        if kind == "data":
            return
        if kind == "field":
            line = bytes(self._field).removesuffix(b"\r")
            self._field = bytearray()
        else:  # shorter than "data: "
            line = bytes(self._start).removesuffix(b"\r")
            self._start.clear()
            if not line:
                self._event_end(out)
                return
            if line == b"data" or line.startswith(b"data:"):
                self._data_line(line.removeprefix(b"data").removeprefix(b":"), out)
                return
        if len(line) <= FIELD_LINE_BYTES and not line.startswith(b":"):
            self._fields.append(line)

    def _data_line(self, value: bytes, out: bytearray) -> None:
        """A data line begins with ``value``: the event's data gets a line feed between it
        and the data before."""
        if self._data is None:
            self._data = MessageBuffer(self._limits, self._kind)
        else:
            self._data_part(b"\n", out)
        self._data_part(value, out)

    def _data_part(self, part: bytes, out: bytearray) -> None:
        data = self._data
        if data is None or self._skip_event:
            return
        if self._held_cr:
            self._held_cr = False
            part = b"\r" + part
        if part.endswith(b"\r") and self._line_kind == "data":
            self._held_cr = True
            part = part[:-1]
        if not part or not data.add(part):
            return
        message, note = cut_message(data.head, limit=data.limit, request_id=self._request_id)
        logger.warning("MCP server %s: %s", self._server, note)
        self._skip_event = True
        if message is not None:
            out += _event(self._fields, encode(_for_request(message, self._request_id)))
            self.done = self._request_id is not None  # the POST's reply: its stream is over

    def _event_end(self, out: bytearray) -> None:
        fields, data, skipped = self._fields, self._data, self._skip_event
        self._fields, self._data, self._skip_event = [], None, False
        if skipped:
            return
        if data is None:
            if fields:
                out += b"".join(f + b"\n" for f in fields) + b"\n"
            return
        payload = data.head
        message, problem = read_message(payload)
        if not payload.strip() or (message is not None and not _unreadable(message)):
            out += _event(fields, payload)
            return
        if problem is not None:
            logger.warning("MCP server %s: %s", self._server, problem)
        if message is not None:
            out += _event(fields, encode(_for_request(message, self._request_id)))


def _event(fields: list[bytes], payload: bytes) -> bytes:
    """One SSE event: its field lines, then ``payload`` as data lines."""
    lines = [*fields, *(b"data: " + line for line in payload.split(b"\n"))]
    return b"".join(line + b"\n" for line in lines) + b"\n"


def _unreadable(message: types.JSONRPCMessage) -> bool:
    return isinstance(message, types.JSONRPCError) and is_lost_reply(message.error.data)


def _for_request(
    message: types.JSONRPCMessage, request_id: types.RequestId | None
) -> types.JSONRPCMessage:
    """A reply that names no request, as the reply to the POST's ``request_id`` (what the
    SDK does with the replies on a POST's stream)."""
    if request_id is None or not isinstance(message, types.JSONRPCError) or message.id is not None:
        return message
    return message.model_copy(update={"id": request_id})
