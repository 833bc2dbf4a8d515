"""The stdio transport of an agent's MCP server, reading each message within the limits of
``worker.mcp.wire``.

The SDK's ``stdio_client`` gathers a whole line before it parses it (a 50 MB result cost about
150 MiB) and drops a line it cannot parse (its call then waits for its timeout). It offers no
hook on the bytes, so this transport (the SDK's ``Transport`` protocol: a context manager of a
read and a write stream, which ``mcp.Client`` takes) does what it does, but reads its way:

* the server starts as the SDK starts it: in a process group of its own, with the SDK's
  minimal inherited environment (``get_default_environment``) and the server's variables;
* its stderr is a pipe this transport reads (the SDK hands the server the worker's own
  stderr, so a server's ``\x1b[31m`` reached the operator's terminal raw, and a non-JSON line
  the JSON log stream): each line becomes a log record of logger ``worker.mcp.stdio`` naming
  the server, its text escaped (``worker.terminal_text.visible_line``). Bounded
  (``StderrLines``): a line is kept to ``STDERR_LINE_BYTES`` (the rest is dropped as it comes
  and counted), and at most ``STDERR_BURST`` lines are logged at once, ``STDERR_LINES_PER_S``
  a second after that; the lines past the rate are dropped and counted in the next line
  logged (or at the end). The pipe is always read, so a flood neither blocks the server nor
  grows the worker's memory;
* stdout is read in parts of ``CHUNK_BYTES`` and split at ``\\n``; of each line only what
  ``wire.MessageBuffer`` keeps is kept. A line past its limit is cut (``wire.cut_message``)
  and handed on as soon as it is known which request it answers (an id in its first bytes,
  or the only ``tools/call`` in flight), else when it ends (the id may be last); the rest of
  it is dropped as it arrives, and the session goes on with the next line;
* a whole line is handed on as ``wire.read_message`` reads it (a garbled reply becomes an
  error reply for its call; a line that is not JSON-RPC at all is logged and skipped);
* each message is written as one line of JSON, as the SDK writes it;
* closing follows the MCP specification's shutdown, with the SDK's waits: stdin is closed,
  then after ``EXIT_GRACE_S`` the process group gets SIGTERM, after ``KILL_GRACE_S`` more
  SIGKILL; stdout is drained meanwhile, so a server stuck writing can exit.

POSIX only, like the worker.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import AsyncIterator, Callable

import anyio
import mcp.types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from worker.mcp.guard import RequestLedger
from worker.mcp.wire import (
    MessageBuffer,
    WireLimits,
    cut_message,
    encode,
    looks_like_call_result,
    read_message,
)
from worker.terminal_text import visible_line

__all__ = [
    "CHUNK_BYTES",
    "EXIT_GRACE_S",
    "KILL_GRACE_S",
    "STDERR_BURST",
    "STDERR_LINES_PER_S",
    "STDERR_LINE_BYTES",
    "LineReader",
    "StderrLines",
    "bounded_stdio_client",
]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
"""Bytes read from the server's stdout at a time."""
EXIT_GRACE_S = 2.0
"""Seconds a server may take to exit once its stdin is closed (the SDK's wait)."""
KILL_GRACE_S = 2.0
"""Seconds between SIGTERM and SIGKILL, and for the kill to be seen (the SDK's waits)."""
FLUSH_S = 0.5
"""Seconds the messages already accepted may take to be written at close."""
STDERR_LINE_BYTES = 2048
"""Bytes of one line of a server's stderr logged at most (the rest is counted)."""
STDERR_BURST = 100
"""Lines of a server's stderr logged at once at most (its start-up banner, a traceback)."""
STDERR_LINES_PER_S = 10.0
"""Lines of a server's stderr logged a second at most after a burst."""

_Read = MemoryObjectReceiveStream[SessionMessage | Exception]
_Write = MemoryObjectSendStream[SessionMessage]


class LineReader:
    """Newline-delimited JSON-RPC in parts of any size → the messages to hand on (see the
    module docstring).

    Args:
        limits: bytes of one message at most.
        ledger: the session's requests (for the only call in flight); ``None``: not known.
        server: the server as logs name it.
    """

    def __init__(self, limits: WireLimits, ledger: RequestLedger | None, server: str) -> None:
        self._limits = limits
        self._ledger = ledger
        self._server = server
        self._line = MessageBuffer(limits, "any")
        self._handed_on = False

    def feed(self, data: bytes) -> list[types.JSONRPCMessage]:
        """The messages ``data`` completes (or cuts), in order."""
        out: list[types.JSONRPCMessage] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            part = data[start:] if end < 0 else data[start:end]
            if part and self._line.add(part):
                self._cut(self._line, out, ended=False)
            if end < 0:
                return out
            self._end_line(out)
            start = end + 1

    def finish(self) -> list[types.JSONRPCMessage]:
        """The messages of a last line without its ``\\n`` (the server's output ended)."""
        out: list[types.JSONRPCMessage] = []
        if self._line.size:
            self._end_line(out)
        return out

    def _end_line(self, out: list[types.JSONRPCMessage]) -> None:
        line = self._line
        self._line = MessageBuffer(self._limits, "any")
        if line.over:
            if not self._handed_on:
                self._cut(line, out, ended=True)
            logger.info("MCP server %s: the cut message had %d bytes", self._server, line.size)
            self._handed_on = False
            return
        message, problem = read_message(line.head)
        if problem is not None:
            logger.warning("MCP server %s: %s", self._server, problem)
        if message is not None:
            out.append(message)

    def _cut(self, line: MessageBuffer, out: list[types.JSONRPCMessage], *, ended: bool) -> None:
        head = line.head
        fallback = None
        if self._ledger is not None and looks_like_call_result(head):
            fallback = self._ledger.only_call_in_flight()
        message, note = cut_message(
            head, limit=line.limit, tail=line.tail if ended else b"", request_id=fallback
        )
        if message is not None and not ended and getattr(message, "id", None) is None:
            return  # which request it answers may show at its end
        self._handed_on = True
        logger.warning("MCP server %s: %s", self._server, note)
        if message is not None:
            out.append(message)


class StderrLines:
    """A server's stderr in parts of any size → log records, one a line (see the module
    docstring). Memory is bounded by ``line_bytes``, whatever comes.

    Args:
        server: the server as logs name it.
        line_bytes: bytes of a line kept at most.
        burst: lines logged at once at most (a token bucket of this size).
        per_s: lines logged a second at most after that (the bucket's refill rate).
        clock: seconds, monotonic (default ``time.monotonic``); tests pass their own.
    """

    def __init__(
        self,
        server: str,
        *,
        line_bytes: int = STDERR_LINE_BYTES,
        burst: int = STDERR_BURST,
        per_s: float = STDERR_LINES_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._server = server
        self._line_bytes = line_bytes
        self._burst = burst
        self._per_s = per_s
        self._clock = clock
        self._tokens = float(burst)
        self._refilled = clock()
        self._line = bytearray()
        self._cut = 0  # bytes of the current line past line_bytes
        self._dropped = 0  # lines not logged for the rate since the last one logged
        self.logged = 0
        """Lines logged so far."""

    def feed(self, data: bytes) -> None:
        """Log the lines ``data`` ends (its last part waits for the rest of its line)."""
        start = 0
        while True:
            end = data.find(b"\n", start)
            part = data[start:] if end < 0 else data[start:end]
            room = self._line_bytes - len(self._line)
            self._line += part[:room]
            self._cut += max(0, len(part) - room)
            if end < 0:
                return
            self._end_line()
            start = end + 1

    def finish(self) -> None:
        """The stream ended: log a last line without its ``\n``, and what was dropped."""
        if self._line or self._cut:
            self._end_line()
        if self._dropped:
            logger.warning(
                "MCP server %s: %d more stderr line(s) not logged (more than %g a second)",
                self._server,
                self._dropped,
                self._per_s,
            )
            self._dropped = 0

    def _end_line(self) -> None:
        line, cut = bytes(self._line).rstrip(b"\r"), self._cut
        self._line.clear()
        self._cut = 0
        if not line and not cut:
            return  # a blank line
        if not self._allowed():
            self._dropped += 1
            return
        text = visible_line(line.decode("utf-8", errors="backslashreplace"))
        if cut:
            text += f" … ({cut} more bytes not logged)"
        if self._dropped:
            text += (
                f" ({self._dropped} line(s) before it not logged: more than "
                f"{self._per_s:g} a second)"
            )
            self._dropped = 0
        self.logged += 1
        logger.info("MCP server %s (stderr): %s", self._server, text)

    def _allowed(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._per_s)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    params: StdioServerParameters,
    *,
    limits: WireLimits,
    ledger: RequestLedger | None = None,
    server: str = "",
) -> AsyncIterator[tuple[_Read, _Write]]:
    """Start ``params``'s server and yield the streams of its session (see the module
    docstring); at exit the server is stopped.

    Args:
        limits: bytes of one incoming message at most.
        ledger: the session's requests, when a ``worker.mcp.guard.SessionGuard`` keeps them.
        server: the server as logs name it (no secrets); its stderr lines are logged with
            it (``StderrLines``).

    Raises:
        OSError: the process could not be started (``FileNotFoundError``: no such command).
    """
    process = await anyio.open_process(
        [params.command, *params.args],
        env=get_default_environment() | (params.env or {}),
        stderr=subprocess.PIPE,
        cwd=params.cwd,
        start_new_session=True,
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    reader = LineReader(limits, ledger, server)
    writer_done = anyio.Event()
    stderr_done = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_pump_stdout, process, reader, read_writer)
        tg.start_soon(_pump_stderr, process, server, stderr_done)
        tg.start_soon(_pump_stdin, process, write_reader, read_writer, writer_done)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()  # the reader drains from now on
                write_stream.close()
                with anyio.move_on_after(FLUSH_S):
                    await writer_done.wait()
                await _stop(process, server)
                with anyio.move_on_after(FLUSH_S):  # its last lines (a child may hold it open)
                    await stderr_done.wait()
                with anyio.move_on_after(KILL_GRACE_S), contextlib.suppress(OSError):
                    await process.aclose()
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            tg.cancel_scope.cancel()


async def _pump_stdout(
    process: Process,
    reader: LineReader,
    read_writer: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    """Hand the messages of the server's stdout to the session; once the session is gone,
    drain stdout (so that the server can exit) until it ends."""
    stdout = process.stdout
    assert stdout is not None
    delivering = True
    async with read_writer:
        while True:
            try:
                data = await stdout.receive(CHUNK_BYTES)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                data = b""
            except OSError:
                return
            if delivering:
                for message in reader.feed(data) if data else reader.finish():
                    try:
                        await read_writer.send(SessionMessage(message))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        delivering = False  # the session is gone: drain, so it can exit
                        break
            if not data:
                return


async def _pump_stderr(process: Process, server: str, done: anyio.Event) -> None:
    """Log the server's stderr (``StderrLines``) until it ends; set ``done`` then."""
    stderr = process.stderr
    assert stderr is not None
    lines = StderrLines(server)
    try:
        while True:
            try:
                data = await stderr.receive(CHUNK_BYTES)
            except (
                anyio.EndOfStream,
                anyio.ClosedResourceError,
                anyio.BrokenResourceError,
                OSError,
            ):
                return
            lines.feed(data)
    finally:
        lines.finish()
        done.set()


async def _pump_stdin(
    process: Process,
    write_reader: MemoryObjectReceiveStream[SessionMessage],
    read_writer: MemoryObjectSendStream[SessionMessage | Exception],
    done: anyio.Event,
) -> None:
    """Write the session's messages to the server's stdin, one line each; when the server
    stops reading, end the session's read stream. Set ``done`` at the end."""
    stdin = process.stdin
    assert stdin is not None
    try:
        async with write_reader:
            async for item in write_reader:
                await stdin.send(encode(item.message) + b"\n")
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # the server stopped reading: the session sees its connection end
        await read_writer.aclose()
    finally:
        done.set()


async def _stop(process: Process, server: str) -> None:
    """Close stdin, wait, then SIGTERM and SIGKILL the process group (never raises); the
    caller closes its other pipes (``Process.aclose``) once it has read them."""
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, EXIT_GRACE_S):
        await terminate_posix_process_tree(process, KILL_GRACE_S)
        if not await _exited(process, KILL_GRACE_S):
            logger.warning("MCP server %s: process %d survived SIGKILL", server, process.pid)


async def _exited(process: Process, timeout_s: float) -> bool:
    """True when ``process`` exits within ``timeout_s`` (polled: ``wait()`` would also wait
    for a pipe a child of it may hold open)."""
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:  # noqa: ASYNC110 (no event says a process exited)
            await anyio.sleep(0.01)
        return True
    return False
