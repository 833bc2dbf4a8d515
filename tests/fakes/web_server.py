"""FakeWebServer: a real HTTP server on 127.0.0.1 that serves scripted pages, for web_fetch.

Like ``FakeLLMServer`` it runs stdlib ``ThreadingHTTPServer`` in a daemon thread on an
OS-assigned port. Pages are scripted per path with ``page`` (status, body, content type,
headers, a delay before answering), ``redirect`` and ``stream`` (a body of chunks sent until
the client hangs up, at most ``max_bytes``); ``hold`` makes a path wait until ``release()``
or ``stop()``. Every request is recorded (``requests``: path and headers) with its start and
end on the server's monotonic clock, so tests can see which requests overlapped. With
``tls=(certfile, keyfile)`` it speaks HTTPS and records the TLS server names (SNI) clients sent.

Example::

    with FakeWebServer() as web:
        web.page("/a", "<html><body><p>Hi</p></body></html>")
        web.redirect("/old", "/a")
        ... fetch(web.url("/old")) ...
"""

from __future__ import annotations

import dataclasses
import gzip
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["FakeWebServer", "RecordedRequest"]


@dataclass(frozen=True)
class _Page:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "text/html; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    held: bool = False
    stream_chunk: bytes | None = None
    stream_max_bytes: int = 0
    stream_interval_s: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it (``started_s`` / ``ended_s``: ``time.monotonic()``;
    ``ended_s`` is ``None`` while the answer is being sent). A request is recorded as soon as
    it arrives, so a client that got its answer finds it in ``requests``."""

    path: str
    headers: dict[str, str]
    started_s: float
    ended_s: float | None = None


class FakeWebServer:
    """A scriptable web server on 127.0.0.1 (see the module docstring).

    Attributes:
        requests: every answered (or abandoned) request, in the order they ended.
        max_in_flight: the most requests the server was handling at once.
        sni_names: TLS server names sent by clients (with ``tls``).
    """

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self._tls = tls
        self.sni_names: list[str | None] = []
        self._pages: dict[str, _Page] = {}
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._in_flight = 0
        self.max_in_flight = 0
        self.requests: list[RecordedRequest] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind 127.0.0.1 on a free port and serve from a daemon thread."""
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        httpd.daemon_threads = True
        if self._tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self._tls)
            context.sni_callback = lambda _sock, name, _ctx: self.sni_names.append(name)
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release held requests, stop serving and close the socket. Idempotent."""
        httpd, self._httpd = self._httpd, None
        self._released.set()
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
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeWebServer is not started")
        return int(self._httpd.server_address[1])

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        """``http(s)://<host>:<port><path>``; give ``host`` to reach it by a (resolved) name."""
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    # -- scripting ---------------------------------------------------------------------------

    def page(
        self,
        path: str,
        body: str | bytes = "",
        *,
        status: int = 200,
        content_type: str | None = "text/html; charset=utf-8",
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
        gzipped: bool = False,
        held: bool = False,
    ) -> None:
        """Serve ``body`` at ``path`` (``content_type=None`` sends no Content-Type)."""
        data = body.encode() if isinstance(body, str) else body
        extra = dict(headers or {})
        if gzipped:
            data = gzip.compress(data)
            extra["Content-Encoding"] = "gzip"
        self._pages[path] = _Page(status, data, content_type, extra, delay_s, held)

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        """Answer ``path`` with ``status`` and ``Location: location``."""
        self._pages[path] = _Page(status, b"", None, {"Location": location})

    def stream(
        self, path: str, chunk: bytes, *, max_bytes: int = 50_000_000, interval_s: float = 0.0
    ) -> None:
        """Answer ``path`` with ``chunk`` repeated (no Content-Length), one every
        ``interval_s`` seconds, until the client hangs up, ``max_bytes`` were sent or the
        server stops."""
        self._pages[path] = _Page(
            200,
            b"",
            "text/plain",
            {},
            stream_chunk=chunk,
            stream_max_bytes=max_bytes,
            stream_interval_s=interval_s,
        )

    def release(self) -> None:
        """Let held requests be answered."""
        self._released.set()

    # -- serving (handler threads) -----------------------------------------------------------

    def _enter(self, path: str, headers: dict[str, str]) -> int:
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            self.requests.append(RecordedRequest(path, headers, time.monotonic()))
            return len(self.requests) - 1

    def _leave(self, index: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self.requests[index] = dataclasses.replace(
                self.requests[index], ended_s=time.monotonic()
            )


def _make_handler(server: FakeWebServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            index = server._enter(self.path, dict(self.headers.items()))
            try:
                self._serve(server._pages.get(self.path.split("?", 1)[0]))
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client stopped reading: that is allowed
            finally:
                server._leave(index)

        def _serve(self, page: _Page | None) -> None:
            if page is None:
                page = _Page(404, b"<html><body><h1>Not found</h1></body></html>")
            if page.held:
                server._released.wait()
                if server._httpd is None:
                    self.close_connection = True
                    return
            if page.delay_s:
                time.sleep(page.delay_s)
            self.send_response(page.status)
            if page.content_type is not None:
                self.send_header("Content-Type", page.content_type)
            for name, value in page.headers.items():
                self.send_header(name, value)
            if page.stream_chunk is not None:
                self.send_header("Connection", "close")
                self.end_headers()
                sent = 0
                while sent < page.stream_max_bytes and server._httpd is not None:
                    self.wfile.write(page.stream_chunk)
                    self.wfile.flush()
                    sent += len(page.stream_chunk)
                    if page.stream_interval_s:
                        server._released.wait(page.stream_interval_s)  # stop() cuts it short
                self.close_connection = True
                return
            self.send_header("Content-Length", str(len(page.body)))
            self.end_headers()
            self.wfile.write(page.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet

    return Handler
