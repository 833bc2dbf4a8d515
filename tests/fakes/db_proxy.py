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

``url_for(url)`` is ``url`` through the proxy. ``outages`` counts the outages so far,
``connections`` the client connections accepted and ``lost_answers`` the answers lost.

Example::

    async with FlakyProxy(database_url) as proxy:
        engine = create_engine(proxy.url_for(database_url))
        ...
        await proxy.outage(0.5)   # returns at once; the outage ends by itself
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Self

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
        self.outages = 0
        self.connections = 0
        self.lost_answers = 0

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

    def _marks(self, data: bytes) -> bool:
        """Whether ``data`` from a client is the statement whose answer is to be lost."""
        if self._lose_next and data[:1] == b"B":
            self._lose_next = False
            return True
        return False

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
        if self.down:
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
            await asyncio.gather(
                _pump(reader, upstream_writer, self._flowing, mark=self._marks, marked=marked),
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


ANSWER_SETTLE_S = 0.05
"""Seconds a lost answer's connection stays open after the answer's first bytes came: the
server commits at the statement's Sync, before it answers, and ends its reply meanwhile."""


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    flowing: asyncio.Event,
    *,
    mark: Callable[[bytes], bool] | None = None,
    marked: asyncio.Event | None = None,
    lose: asyncio.Event | None = None,
    lost: Callable[[], None] | None = None,
) -> None:
    """Copy ``reader`` to ``writer``. Client to server: data ``mark`` picks sets ``marked``.
    Server to client: once ``lose`` is set, the next data is swallowed and both sides cut."""
    try:
        while data := await reader.read(65536):
            await flowing.wait()
            if lose is not None and lose.is_set():
                await asyncio.sleep(ANSWER_SETTLE_S)
                if lost is not None:
                    lost()
                return  # the finally cuts this side; the other pump ends with it
            if mark is not None and marked is not None and mark(data):
                marked.set()
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
