"""What the benchmarks share: a PostgreSQL server to use, and a throw-away database in it.

``database_server()`` is ``MANA_AI_TEST_DATABASE_URL`` when set, else an embedded PostgreSQL
in a temporary directory (deleted at exit). ``throwaway_database(server)`` creates a database
with a random name in that server, yields its URL, and drops it afterwards (``WITH (FORCE)``,
so connections a crashed run left behind do not keep it). ``otlp_sink()`` is an OTLP/HTTP
endpoint in another process that accepts and drops what an exporter sends, as a collector
would, without costing the benchmarked process anything but the export itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import make_url, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.database_url import to_async_url
from worker.db.embedded import start_embedded_postgres
from worker.db.engine import create_engine

__all__ = [
    "RoundTripCounter",
    "at_least",
    "create_database",
    "database_server",
    "drop_database",
    "otlp_sink",
    "throwaway_database",
]


def at_least(minimum: float, kind: type = int) -> Callable[[str], Any]:
    """An argparse ``type``: a number of ``kind`` not below ``minimum``, else a usage error."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


@contextmanager
def database_server() -> Iterator[tuple[str, str]]:
    """``(server URL, where)``: ``MANA_AI_TEST_DATABASE_URL``, or an embedded PostgreSQL in
    a temporary directory for the duration of the block."""
    url = os.environ.get("MANA_AI_TEST_DATABASE_URL")
    with tempfile.TemporaryDirectory(prefix="mana-ai-bench-") as tmp:
        if url:
            yield to_async_url(url), "MANA_AI_TEST_DATABASE_URL"
            return
        Path(tmp).chmod(0o755)  # as root the embedded server's user must enter it
        embedded = start_embedded_postgres(Path(tmp) / "pgdata", cleanup_mode="delete")
        yield embedded, "embedded PostgreSQL"


async def create_database(server_url: str, prefix: str = "mana_ai_bench") -> str:
    """Create a database with a random name in ``server_url``'s server; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    await _admin(server_url, f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


async def drop_database(server_url: str, url: str) -> None:
    """Drop ``url``'s database, ``WITH (FORCE)``: connections a crashed run left do not keep
    it."""
    await _admin(server_url, f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


async def _admin(server_url: str, statement: str) -> None:
    admin = create_engine(server_url, pool_size=1, max_overflow=0)
    try:
        async with admin.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(statement))
    finally:
        await admin.dispose()


@asynccontextmanager
async def throwaway_database(server_url: str, prefix: str = "mana_ai_bench") -> AsyncIterator[str]:
    """A new, empty database in ``server_url``'s server; its URL; dropped on exit."""
    url = await create_database(server_url, prefix)
    try:
        yield url
    finally:
        await drop_database(server_url, url)


class RoundTripCounter:
    """A TCP proxy in front of PostgreSQL that counts its clients' round trips at the wire.

    Every frontend Sync (``S``) and simple Query (``Q``) message ends a round trip: the client
    then waits for the server's ReadyForQuery (PostgreSQL protocol v3, "Message Flow"). So
    BEGIN and COMMIT count (asyncpg sends them as simple queries), a prepare counts apart
    from its execution, and a connection's set-up queries count too. ``url(database_url)``
    is the URL to give the engine under test (plain TCP to the proxy, ``ssl=disable`` so the
    stream stays readable).
    """

    SSL_REQUEST = 80877103
    GSSENC_REQUEST = 80877104

    def __init__(self, database_url: str) -> None:
        self._target = make_url(database_url)
        self.round_trips = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RoundTripCounter:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()

    def url(self) -> str:
        """The target database's URL, through this proxy."""
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        proxied = self._target.difference_update_query(["host", "ssl"]).set(
            host="127.0.0.1", port=port
        )
        return proxied.update_query_dict({"ssl": "disable"}).render_as_string(hide_password=False)

    async def _open_target(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        socket_dir = self._target.query.get("host")
        port = self._target.port or 5432
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            return await asyncio.open_unix_connection(f"{socket_dir}/.s.PGSQL.{port}")
        return await asyncio.open_connection(self._target.host or "127.0.0.1", port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_reader, server_writer = await self._open_target()
        upstream = asyncio.create_task(self._pump_counting(reader, server_writer))
        downstream = asyncio.create_task(_pump(server_reader, writer))
        await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        for task in (upstream, downstream):
            task.cancel()
        for w in (writer, server_writer):
            w.close()

    async def _pump_counting(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        buf = b""
        startup = True
        while data := await reader.read(65536):
            writer.write(data)
            buf += data
            while True:
                if startup:
                    if len(buf) < 8:
                        break
                    length = int.from_bytes(buf[:4], "big")
                    if len(buf) < length:
                        break
                    code = int.from_bytes(buf[4:8], "big")
                    startup = code in (self.SSL_REQUEST, self.GSSENC_REQUEST)
                    buf = buf[length:]
                    continue
                if len(buf) < 5:
                    break
                length = int.from_bytes(buf[1:5], "big")
                if len(buf) < 1 + length:
                    break
                if buf[:1] in (b"S", b"Q"):
                    self.round_trips += 1
                buf = buf[1 + length :]
            await writer.drain()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


_OTLP_SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextmanager
def otlp_sink() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: an OTLP/HTTP endpoint in a child process that answers
    every export 200 and keeps nothing; stopped on exit."""
    child = subprocess.Popen([sys.executable, "-c", _OTLP_SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(timeout=10)
