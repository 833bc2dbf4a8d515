"""FlakyProxy: a TCP proxy in front of PostgreSQL that drops connections on demand.

It listens on 127.0.0.1 with an OS-assigned port and forwards every connection to the
server of a database URL (TCP host and port, or the unix socket of an embedded server), on
the test's event loop. ``outage(seconds)`` is what a network blip, a failover or a restarting
server looks like to a client: every open connection is cut at once, and new ones are
refused (accepted, then closed before a byte is answered) until the outage is over.

``black_hole()`` is a network that silently drops everything (a firewall, a dead peer
behind a NAT): connections stay open, new ones are accepted, and no byte goes through in
either direction until ``restore()``.

``lose_next_answer()`` loses the answer of the next statement a client runs: the statement
reaches the server, which runs and commits it, and the connection is cut before a byte of
the answer reaches the client (a network that drops as the server answers). The client
cannot tell whether it committed.

``refuse_connection(n)`` and ``break_round_trip(n)`` are one fault at one moment, the same
every time: the ``n``-th connection accepted (counted from 1 since the proxy started) is
refused, or the connection is cut as a client sends its ``n``-th round trip (PostgreSQL's
protocol: a Sync of the extended protocol, or a simple Query; a connection's start-up is not
one), before it reaches the server or, with ``lose_answer=True``, after (the server runs and
commits it, its answer is lost). A test counts a clean run's ``connections`` and
``round_trips`` first, then breaks each of them in turn.

``die_at(n)`` is a client killed at its ``n``-th round trip: that round trip broken as
``break_round_trip`` breaks it, then nothing more gets through until ``end_outage()``.

``url_for(url)`` is ``url`` through the proxy. ``outages`` counts the outages so far,
``connections`` the client connections accepted, ``round_trips`` the round trips clients
sent, ``lost_answers`` the answers lost and ``faults`` the connections refused and round
trips cut or lost that ``refuse_connection`` and ``break_round_trip`` asked for.

Example::

    async with FlakyProxy(database_url) as proxy:
        engine = create_engine(proxy.url_for(database_url))
        ...
        await proxy.outage(0.5)   # returns at once; the outage ends by itself
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from types import TracebackType
from typing import Literal, Self

from sqlalchemy.engine import make_url

__all__ = ["FlakyProxy"]


class FlakyProxy:
    """See the module docstring."""

    def __init__(self, upstream_url: str) -> None:
        parsed = make_url(upstream_url)
        socket_dir = parsed.query.get("host")
        self._unix: str | None = None
        self._host = parsed.host or "127.0.0.1"
        self._port = parsed.port or 5432
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            self._unix = f"{socket_dir}/.s.PGSQL.{parsed.port or 5432}"
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._down_until = 0.0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._lose_next = False
        self._refused: set[int] = set()
        self._broken: dict[int, bool] = {}  # round trip -> lose its answer (else: cut it)
        self.outages = 0
        self._dying: int | None = None
        self.died = asyncio.Event()
        self.connections = 0
        self.round_trips = 0
        self.lost_answers = 0
        self.faults = 0

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    def url_for(self, url: str) -> str:
        """``url`` (same user, password and database) through this proxy, over TCP."""
        parsed = make_url(url)
        query = {k: v for k, v in parsed.query.items() if k != "host"}
        return parsed.set(host="127.0.0.1", port=self.port, query=query).render_as_string(
            hide_password=False
        )

    @property
    def down(self) -> bool:
        """True during an outage."""
        return asyncio.get_running_loop().time() < self._down_until

    async def back_up(self) -> None:
        """Return once the outage under way (if any) is over."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._down_until - loop.time()))

    async def outage(self, seconds: float) -> None:
        """Cut every open connection now and refuse new ones for ``seconds``."""
        loop = asyncio.get_running_loop()
        self._down_until = max(self._down_until, loop.time() + seconds)
        self.outages += 1
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)

    def end_outage(self) -> None:
        """Let new connections in again now (an outage of ``outage`` ends early)."""
        self._down_until = 0.0

    def black_hole(self) -> None:
        """From now on no byte goes through, either way (see the module docstring)."""
        self._flowing.clear()

    def restore(self) -> None:
        """Let bytes through again (what was held back goes on)."""
        self._flowing.set()

    def lose_next_answer(self) -> None:
        """Lose the answer of the next statement a client sends (its Bind message of
        PostgreSQL's extended protocol, as asyncpg sends every statement): see the module
        docstring."""
        self._lose_next = True

    def refuse_connection(self, n: int) -> None:
        """Refuse the ``n``-th connection (counted from 1 since the proxy started; see the
        module docstring)."""
        self._refused.add(n)

    def break_round_trip(self, n: int, *, lose_answer: bool = False) -> None:
        """Cut the connection of the ``n``-th round trip (counted from 1 since the proxy
        started) as the client sends it: before the server gets it, or after it answered
        with ``lose_answer`` (see the module docstring)."""
        self._broken[n] = lose_answer

    def die_at(self, n: int, *, lose_answer: bool = False) -> None:
        """A client that dies at its ``n``-th round trip: that round trip is broken as
        ``break_round_trip`` breaks it, and from then on every connection is cut and every
        new one refused (as after a ``kill -9``: nothing more of the client reaches the
        server) until ``end_outage()``; ``died`` is set then."""
        self._broken[n] = lose_answer
        self._dying = n

    def _die(self) -> None:
        self._down_until = float("inf")
        self.died.set()
        for pipe in list(self._pipes):
            pipe.cancel()

    def _judge(self, kinds: list[bytes]) -> _Verdict:
        """What becomes of a client's data holding whole messages of ``kinds`` (their type
        bytes): sent on (``None``), cut before it reaches the server, or its answer lost."""
        verdict: _Verdict = None
        for kind in kinds:
            if kind == b"B" and self._lose_next:
                self._lose_next = False
                verdict = verdict or "lose"
            if kind in (b"S", b"Q"):
                self.round_trips += 1
                broken = self._broken.pop(self.round_trips, None)
                if broken is not None:
                    self.faults += 1
                    if self._dying == self.round_trips:
                        # the others now; this one as its verdict says (after its answer's
                        # settle time when it is lost)
                        delay = ANSWER_SETTLE_S * 2 if broken else 0.0
                        asyncio.get_running_loop().call_later(delay, self._die)
                    return "lose" if broken else "cut"
        return verdict

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        refused = self.connections in self._refused
        self.faults += refused
        if self.down or refused:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            if self._unix is not None:
                up_reader, upstream_writer = await asyncio.open_unix_connection(self._unix)
            else:
                up_reader, upstream_writer = await asyncio.open_connection(self._host, self._port)
            marked = asyncio.Event()  # this connection's next answer is lost
            messages = _ClientMessages()
            await asyncio.gather(
                _pump(
                    reader,
                    upstream_writer,
                    self._flowing,
                    judge=lambda data: self._judge(messages.feed(data)),
                    marked=marked,
                ),
                _pump(up_reader, writer, self._flowing, lose=marked, lost=self._lost),
                return_exceptions=True,
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._pipes.discard(task)
            for w in (writer, upstream_writer):
                if w is not None:
                    w.transport.abort()  # a cut, not a polite close

    def _lost(self) -> None:
        self.lost_answers += 1


_Verdict = Literal["cut", "lose"] | None

_STARTUP_REQUESTS = {80877103, 80877104}
"""The codes of an SSLRequest and a GSSENCRequest: a StartupMessage follows them."""


class _ClientMessages:
    """The type bytes of the messages a client's bytes complete (PostgreSQL's frontend
    protocol: untyped start-up messages first, an int32 length that counts itself and an
    int32 code; then a type byte and an int32 length that counts itself). Only headers are
    kept: a message's body is counted off as it passes."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._skip = 0  # bytes of the current message's body still to pass
        self._kind = b""  # its type byte (empty: an untyped start-up message)
        self._started = False

    def feed(self, data: bytes) -> list[bytes]:
        kinds: list[bytes] = []
        pos = 0
        while pos < len(data):
            if self._skip:
                step = min(self._skip, len(data) - pos)
                pos, self._skip = pos + step, self._skip - step
                if not self._skip and self._kind:
                    kinds.append(self._kind)
                continue
            size = 8 if not self._started else 5  # start-up: length and code
            step = min(size - len(self._header), len(data) - pos)
            self._header += data[pos : pos + step]
            pos += step
            if len(self._header) < size:
                break
            if not self._started:
                length, code = struct.unpack("!ii", self._header)
                self._started = code not in _STARTUP_REQUESTS
                self._kind, self._skip = b"", length - 8
            else:
                (length,) = struct.unpack_from("!i", self._header, 1)
                self._kind, self._skip = bytes(self._header[:1]), length - 4
                if not self._skip:
                    kinds.append(self._kind)
            self._header.clear()
        return kinds


ANSWER_SETTLE_S = 0.05
"""Seconds a lost answer's connection stays open after the answer's first bytes came: the
server commits at the statement's Sync, before it answers, and ends its reply meanwhile."""


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    flowing: asyncio.Event,
    *,
    judge: Callable[[bytes], _Verdict] | None = None,
    marked: asyncio.Event | None = None,
    lose: asyncio.Event | None = None,
    lost: Callable[[], None] | None = None,
) -> None:
    """Copy ``reader`` to ``writer``. Client to server: data ``judge`` says to cut ends the
    copy before it is sent (the finally cuts both sides), and data whose answer it says to
    lose sets ``marked``. Server to client: once ``lose`` is set, the next data is swallowed
    and both sides cut."""
    try:
        while data := await reader.read(65536):
            await flowing.wait()
            if lose is not None and lose.is_set():
                await asyncio.sleep(ANSWER_SETTLE_S)
                if lost is not None:
                    lost()
                return  # the finally cuts this side; the other pump ends with it
            verdict = judge(data) if judge is not None else None
            if verdict == "cut":
                return
            if verdict == "lose" and marked is not None:
                marked.set()
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
