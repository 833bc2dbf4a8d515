"""FakeMcpHttpServer: ``tests.fakes.mcp_raw`` over streamable HTTP, on 127.0.0.1.

Like ``FakeWebServer`` it runs stdlib ``ThreadingHTTPServer`` in a daemon thread on an
OS-assigned port; MCP is at ``url`` (``/mcp``). Stateless: no ``Mcp-Session-Id``, a GET (the
SDK's stream for server messages) and a DELETE get 405. A POST of a notification or a reply
gets 202; a POST of a request is answered with mcp_raw's messages:

* ``sse=False``: its reply as an ``application/json`` body (notifications and log lines
  before it are not sent), gzip-compressed with ``gzip=True`` whatever the client asked for;
* ``sse=True``: every message as an event of a ``text/event-stream`` body, its reply last.

Bodies have no Content-Length: the connection closes after each (HTTP/1.0), so a huge one is
sent as it is made. ``calls`` records, for each ``tools/call``, the tool's name and whether
the server could send its whole answer (``finished``: ``False`` when the client hung up
first) and how many bytes it sent; ``wait_for_call(name)`` waits until the server is done
with one (a call cut while read is recorded only when the server notices the hang-up).

``version="2026-07-28"`` speaks that protocol version (``mcp_raw.replies``' ``version``).

``errors={"tools/call": (500, "upstream died")}`` answers every POST of that method with
that status and body (``application/json`` when the body starts with ``{``, else text), as
a server behind a proxy that refuses the token (401) or fails (500) does.

Example::

    with FakeMcpHttpServer(sse=True) as server:
        ... McpServerConfig(name="raw", transport="http", url=server.url) ...
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from tests.fakes.mcp_raw import Outgoing, replies

__all__ = ["FakeMcpHttpServer", "RecordedCall"]


@dataclass(frozen=True)
class RecordedCall:
    """One ``tools/call`` as the server answered it."""

    name: str
    finished: bool
    sent_bytes: int


class FakeMcpHttpServer:
    """See the module docstring."""

    def __init__(
        self,
        *,
        sse: bool = False,
        gzip: bool = False,
        errors: dict[str, tuple[int, str]] | None = None,
        version: str | None = None,
    ) -> None:
        self.sse = sse
        self.gzip = gzip
        self.version = version
        self.errors = dict(errors or {})
        self.calls: list[RecordedCall] = []
        self._recorded = threading.Condition()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("FakeMcpHttpServer is not started")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/mcp"

    def wait_for_call(self, name: str, timeout_s: float = 10.0) -> RecordedCall:
        """The last recorded call of tool ``name``, once there is one (blocking).

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        with self._recorded:
            if not self._recorded.wait_for(
                lambda: any(c.name == name for c in self.calls), timeout_s
            ):
                raise TimeoutError(f"no call of {name} was recorded within {timeout_s} s")
            return [c for c in self.calls if c.name == name][-1]

    def _record(self, call: RecordedCall) -> None:
        with self._recorded:
            self.calls.append(call)
            self._recorded.notify_all()


def _chunks(outgoing: Outgoing) -> Iterator[bytes]:
    for index, chunk in enumerate(outgoing.chunks):
        if index and outgoing.pause_s:
            time.sleep(outgoing.pause_s)
        yield chunk


def _gzipped(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks`` as one gzip stream, each flushed as it is made (as a streaming server does:
    50 MB of ``x`` make about 50 KB)."""
    packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16)
    for chunk in chunks:
        yield packer.compress(chunk) + packer.flush(zlib.Z_SYNC_FLUSH)
    yield packer.flush()


def _make_handler(server: FakeMcpHttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._status(405)

        def do_DELETE(self) -> None:
            self._status(405)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            message = json.loads(self.rfile.read(length) or b"{}")
            failure = server.errors.get(str(message.get("method"))) if message else None
            if failure is not None:
                status, text = failure
                self.send_response(status)
                json_body = text.startswith("{")
                self.send_header("Content-Type", "application/json" if json_body else "text/plain")
                self.send_header("Content-Length", str(len(text.encode())))
                self.end_headers()
                self.wfile.write(text.encode())
                return
            outgoing = replies(message, version=server.version) if isinstance(message, dict) else []
            if not outgoing:
                self._status(202)
                return
            call = message.get("method") == "tools/call"
            name = str((message.get("params") or {}).get("name")) if call else ""
            sent, finished = 0, False
            try:
                self.send_response(200)
                self.send_header(
                    "Content-Type", "text/event-stream" if server.sse else "application/json"
                )
                if server.gzip and not server.sse:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                for chunk in self._body(outgoing):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    sent += len(chunk)
                finished = True
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up
            finally:
                if call:
                    server._record(RecordedCall(name, finished, sent))

        def _body(self, outgoing: list[Outgoing]) -> Iterator[bytes]:
            if not server.sse:
                [reply] = [o for o in outgoing if o.reply][-1:]
                body = _chunks(reply)
                yield from _gzipped(body) if server.gzip else body
                return
            for message in outgoing:
                yield b"event: message\ndata: "
                yield from _chunks(message)
                yield b"\n\n"

        def _status(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler
