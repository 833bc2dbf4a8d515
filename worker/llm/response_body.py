"""Reading an HTTP answer's body within a byte cap, decoded as it arrives.

An endpoint decides how much it sends; the reader decides how much it holds. ``read_body``
takes the raw stream chunk by chunk (the transport's chunks: 16 KiB from aiohttp), decodes
``gzip`` / ``deflate`` itself with bounded output per step, so that a small compressed chunk
cannot inflate past the cap (a gzip bomb stops at the cap like a plain flood), and counts the
decoded bytes. Once they pass the cap it stops reading: the caller closes the response, which
drops the connection instead of draining it. A ``Content-Length`` above the cap of a body sent
as is refuses it before a byte is read. The chunks are joined once, at the end, as httpx's own
``aread`` does; a body of one chunk (most chat completions) is not copied at all.

Only the codings in ``ACCEPT_ENCODING`` are asked for, so only they are decoded; a body in
another one is refused (``BodyNotDecodable``), as httpx would need a decoder it cannot bound.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from planner.errors import PlannerError

__all__ = ["ACCEPT_ENCODING", "Answer", "BodyNotDecodable", "BodyTooLarge", "read_body"]

ACCEPT_ENCODING = "gzip, deflate"
"""The ``Accept-Encoding`` to send: the codings ``read_body`` decodes with bounded output."""

INFLATE_STEP_BYTES = 256 * 1024
"""Decoded bytes one inflate step yields at most. zlib builds its output in blocks that it
joins at the end, so one step of the whole cap would briefly hold the cap twice."""


class BodyTooLarge(PlannerError):
    """The body holds more than ``limit_bytes`` decoded bytes.

    Attributes:
        limit_bytes: the cap that was passed.
        announced_bytes: the ``Content-Length`` that said so before anything was read, or
            ``None`` when reading found it out (it stopped after ``limit_bytes + 1`` at most).
    """

    def __init__(self, limit_bytes: int, announced_bytes: int | None = None) -> None:
        super().__init__(f"more than {limit_bytes} bytes")
        self.limit_bytes = limit_bytes
        self.announced_bytes = announced_bytes


class BodyNotDecodable(PlannerError):
    """The body is in a ``Content-Encoding`` that was not asked for, or does not decode."""


class Answer(Protocol):
    """What is read of an HTTP answer, from httpx's client or aiohttp's: httpx's ``Response``
    names (an ``httpx.Response`` is one; ``read_body`` and ``parse_chat_completion`` read
    these)."""

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def is_success(self) -> bool: ...

    @property
    def headers(self) -> Any: ...

    @property
    def encoding(self) -> str | None: ...

    @property
    def is_stream_consumed(self) -> bool: ...

    @property
    def content(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


async def read_body(response: Answer, *, limit_bytes: int, truncate: bool = False) -> bytes:
    """The decoded body of ``response`` (opened with ``stream=True``), at most ``limit_bytes``.

    Args:
        response: an answer whose body has not been read. One that has (a mock transport's
            canned answer) is taken as it is, and held to the same cap.
        limit_bytes: decoded bytes kept at most (>= 1).
        truncate: ``True`` returns the first ``limit_bytes`` bytes of a longer body instead of
            raising (for error bodies, read only for an excerpt).

    Raises:
        BodyTooLarge: the body is longer than ``limit_bytes`` (and ``truncate`` is false).
        BodyNotDecodable: see the class.
        httpx.TransportError: reading failed (as from ``aread``).

    The caller closes the response (``aclose``), whether this returned or raised.
    """
    if response.is_stream_consumed:
        body = response.content
        if len(body) > limit_bytes and not truncate:
            raise BodyTooLarge(limit_bytes)
        return body[:limit_bytes]
    coding = response.headers.get("content-encoding", "").strip().lower()
    if coding in ("", "identity"):
        announced = response.headers.get("content-length", "").strip()
        if announced.isdigit() and int(announced) > limit_bytes and not truncate:
            raise BodyTooLarge(limit_bytes, int(announced))
        return await _read(response, _Plain(), limit_bytes, truncate)
    if coding in ("gzip", "x-gzip"):
        inflate = _Inflate(zlib.MAX_WBITS | 16)
    elif coding == "deflate":
        inflate = _Inflate(zlib.MAX_WBITS, raw_fallback=True)
    else:
        raise BodyNotDecodable(f"Content-Encoding {coding!r}, which was not asked for")
    return await _read(response, inflate, limit_bytes, truncate)


class _Plain:
    """The identity coding: every chunk as it came."""

    def feed(self, data: bytes, room: int) -> tuple[bytes, bytes]:
        """``(decoded, input left for the next call)``; decodes at most ``room`` bytes."""
        return data, b""

    def flush(self) -> bytes:
        return b""


class _Inflate:
    """zlib-wrapped or gzip data, inflated at most ``room`` (and ``INFLATE_STEP_BYTES``) bytes
    per call. ``raw_fallback``: a ``deflate`` body without the zlib header (raw deflate, which
    some servers send for it) is read too, as httpx does."""

    def __init__(self, wbits: int, *, raw_fallback: bool = False) -> None:
        self._decoder = zlib.decompressobj(wbits)
        self._raw_fallback = raw_fallback

    def feed(self, data: bytes, room: int) -> tuple[bytes, bytes]:
        if self._decoder.eof:  # what follows the end of the stream is ignored, as by httpx
            return b"", b""
        try:
            out = self._decoder.decompress(data, min(room, INFLATE_STEP_BYTES))
        except zlib.error as exc:
            if not self._raw_fallback:
                raise BodyNotDecodable(f"the body is not valid compressed data: {exc}") from None
            self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
            self._raw_fallback = False
            return self.feed(data, room)
        if out:  # the first bytes decoded: the format is settled
            self._raw_fallback = False
        tail = self._decoder.unconsumed_tail
        if not out and len(tail) >= len(data):  # no progress: never spin on it
            raise BodyNotDecodable("the compressed data does not advance")
        return out, tail

    def flush(self) -> bytes:
        try:
            return self._decoder.flush()
        except zlib.error as exc:
            raise BodyNotDecodable(f"the body is not valid compressed data: {exc}") from None


async def _read(
    response: Answer, decoder: _Plain | _Inflate, limit_bytes: int, truncate: bool
) -> bytes:
    chunks: list[bytes] = []
    room = limit_bytes  # decoded bytes that may still come
    async for raw in response.aiter_raw():
        pending = raw
        while pending:
            # one byte more than there is room for tells a body that is too long
            data, pending = decoder.feed(pending, room + 1)
            if len(data) > room:
                return _overflow(chunks, data, room, limit_bytes, truncate)
            if data:
                chunks.append(data)
                room -= len(data)
    rest = decoder.flush()
    if len(rest) > room:
        return _overflow(chunks, rest, room, limit_bytes, truncate)
    if rest:
        chunks.append(rest)
    return b"".join(chunks)


def _overflow(
    chunks: list[bytes], data: bytes, room: int, limit_bytes: int, truncate: bool
) -> bytes:
    if not truncate:
        # released now, not when the traceback that holds this frame is collected
        chunks.clear()
        raise BodyTooLarge(limit_bytes)
    chunks.append(data[:room])
    return b"".join(chunks)
