"""read_body: an answer's body held to a cap of decoded bytes, over httpx.MockTransport
streams (no sockets). Over real HTTP: tests/integration/test_llm_flood.py."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterable

import httpx
import pytest

from worker.llm.response_body import (
    ACCEPT_ENCODING,
    BodyNotDecodable,
    BodyTooLarge,
    read_body,
)

MIB = 1024 * 1024


class Source:
    """A body sent in ``chunks``; counts the chunks the reader pulled."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self.pulled = 0

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            self.pulled += 1
            yield chunk


async def answer(
    source: Source, headers: dict[str, str] | None = None, status: int = 200
) -> httpx.Response:
    """``source`` as the streamed body of an answer, unread, as ``send(stream=True)`` gives it."""

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, content=source.stream())

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    async with client:
        return await client.send(client.build_request("POST", "http://llm.test/"), stream=True)


def pieces(data: bytes, size: int = 16 * 1024) -> list[bytes]:
    """``data`` in transport-sized chunks (aiohttp's are 16 KiB)."""
    return [data[i : i + size] for i in range(0, len(data), size)]


def zeros_gzipped(size: int) -> bytes:
    """``size`` zero bytes, gzip-compressed (about a thousandth of the size: a gzip bomb)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(MIB)
    parts = [compressor.compress(block) for _ in range(size // MIB)]
    return b"".join([*parts, compressor.flush()])


async def test_a_body_within_the_cap_is_read_whole() -> None:
    body = b"x" * 100_000
    response = await answer(Source(pieces(body)))
    assert await read_body(response, limit_bytes=100_000) == body


async def test_one_byte_over_the_cap_is_refused() -> None:
    source = Source(pieces(b"x" * 100_001))
    response = await answer(source)
    with pytest.raises(BodyTooLarge) as info:
        await read_body(response, limit_bytes=100_000)
    assert (info.value.limit_bytes, info.value.announced_bytes) == (100_000, None)


async def test_reading_stops_at_the_cap() -> None:
    source = Source(pieces(b"x" * 10 * MIB))  # 640 chunks
    with pytest.raises(BodyTooLarge):
        await read_body(await answer(source), limit_bytes=MIB)
    assert source.pulled == 65  # 64 fill the cap, the 65th passes it: no more is read


async def test_a_content_length_over_the_cap_is_refused_before_reading() -> None:
    source = Source(pieces(b"x" * 2 * MIB))
    response = await answer(source, {"Content-Length": str(2 * MIB)})
    with pytest.raises(BodyTooLarge) as info:
        await read_body(response, limit_bytes=MIB)
    assert info.value.announced_bytes == 2 * MIB
    assert source.pulled == 0


async def test_a_gzip_bomb_stops_at_the_cap_of_decoded_bytes() -> None:
    bomb = zeros_gzipped(64 * MIB)
    assert len(bomb) < 100 * 1024  # the Content-Length says nothing about what it holds
    source = Source(pieces(bomb))
    response = await answer(source, {"Content-Encoding": "gzip", "Content-Length": str(len(bomb))})
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            await read_body(response, limit_bytes=MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB  # the cap, not the 64 MiB the body holds
    assert source.pulled == 1  # one 16 KiB chunk already inflates past 1 MiB


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "raw deflate"])
async def test_compressed_bodies_are_decoded(coding: str) -> None:
    body = b'{"choices": []}' * 10_000
    if coding == "deflate":
        sent = zlib.compress(body)
    elif coding == "raw deflate":  # no zlib header: what some servers send as deflate
        compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        sent, coding = compressor.compress(body) + compressor.flush(), "deflate"
    else:
        sent = gzip.compress(body)
    response = await answer(Source(pieces(sent, 1000)), {"Content-Encoding": coding})
    assert await read_body(response, limit_bytes=len(body)) == body


async def test_a_compressed_body_one_byte_over_the_cap_is_refused() -> None:
    body = b"y" * 100_001
    response = await answer(Source([gzip.compress(body)]), {"Content-Encoding": "gzip"})
    with pytest.raises(BodyTooLarge):
        await read_body(response, limit_bytes=100_000)


@pytest.mark.parametrize(
    ("headers", "chunks", "message"),
    [
        ({"Content-Encoding": "br"}, [b"\x1b\x00"], "Content-Encoding 'br', which was not asked"),
        ({"Content-Encoding": "gzip"}, [b"not gzip at all"], "not valid compressed data"),
    ],
)
async def test_a_body_that_cannot_be_decoded_is_refused(
    headers: dict[str, str], chunks: list[bytes], message: str
) -> None:
    response = await answer(Source(chunks), headers)
    with pytest.raises(BodyNotDecodable, match=message):
        await read_body(response, limit_bytes=MIB)


def test_only_the_codings_it_decodes_are_asked_for() -> None:
    assert ACCEPT_ENCODING == "gzip, deflate"


@pytest.mark.parametrize("headers", [{}, {"Content-Length": str(10 * MIB)}])
async def test_truncate_keeps_the_head_of_a_long_body(headers: dict[str, str]) -> None:
    source = Source(pieces(b"e" * 10 * MIB))
    response = await answer(source, headers, status=500)
    assert await read_body(response, limit_bytes=1000, truncate=True) == b"e" * 1000
    assert source.pulled == 1


async def test_a_body_already_read_is_held_to_the_cap_too() -> None:
    response = httpx.Response(200, content=b"z" * 2000)  # a mock's canned answer
    with pytest.raises(BodyTooLarge):
        await read_body(response, limit_bytes=1999)
    assert await read_body(response, limit_bytes=2000) == b"z" * 2000
