"""FakeLLMServer: a real HTTP server that speaks the OpenAI Chat Completions wire format.

It listens on 127.0.0.1 with an OS-assigned port and serves ``POST /v1/chat/completions`` from a
daemon thread (stdlib ``ThreadingHTTPServer``), so the same server works for async tests in the
test process and for a daemon started as a subprocess (pass it ``base_url``).

Answers come from a queue of scripted replies (``enqueue`` / ``enqueue_text``); when the queue
is empty the default responder answers (a function of the parsed request body). Every parsed
request body is recorded in ``requests``. ``hang()`` makes every answer block until ``release()``
or ``stop()``, for tests that kill a worker mid-mission. ``enqueue(..., trickle_s=0.15)`` sends
the body one byte at a time. ``enqueue_flood(200_000_000)`` answers with a body of that size,
generated as it is sent (1 MiB writes, as fast as the client reads), with or without a
``Content-Length``, optionally gzip-compressed (a gzip bomb: 200 MB in about 300 KB); the bytes
each flood wrote before the client hung up are in ``flood_sent``. ``enqueue_header_flood``
answers with a header too long, or too many headers, for an HTTP client to parse.

``checks`` make it a strict backend: each is ``request body -> error text | None``, and the
first error is answered with a 400 in OpenAI's error shape instead of the next reply, as real
providers refuse what they cannot take back (see ``tests.fakes.provider_zoo``, which also builds
the reply shapes real providers send).

Example::

    with FakeLLMServer() as server:
        server.enqueue(status=500, json={"error": "boom"})
        server.enqueue(json=chat_completion_body(tool_calls=[("clock_now", {})]))
        ... OpenAICompatibleChatModel(base_url=server.base_url) ...
"""

from __future__ import annotations

import functools
import itertools
import json as jsonlib
import socket
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

import httpx

__all__ = [
    "FakeLLMServer",
    "Flood",
    "RequestCheck",
    "Responder",
    "ScriptedReply",
    "chat_completion_body",
    "down_base_url",
    "final_answer_responder",
    "flood_chunks",
]

Responder = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]
"""``request body -> (status, response body)``, used when the reply queue is empty."""

COMPLETIONS_PATH = "/v1/chat/completions"


RequestCheck = Callable[[dict[str, Any]], str | None]
"""``request body -> why a strict backend refuses it`` (``None``: accepted)."""


@dataclass(frozen=True)
class Flood:
    """A body of ``size_bytes`` generated as it is sent (``flood_chunks``): with a
    ``Content-Length`` or chunked (no size announced), and ``gzip`` compressed or not
    (``size_bytes`` is the decoded size; compressed, the body is about a thousandth of it)."""

    size_bytes: int
    content_length: bool = True
    gzip: bool = False


@dataclass(frozen=True)
class ScriptedReply:
    """One queued answer: status, raw body bytes, extra headers, delay before answering,
    ``trickle_s`` > 0 to send the body one byte per that many seconds, and ``flood`` to send
    a generated body of that kind instead of ``body``."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    content_type: str = "application/json"
    trickle_s: float = 0.0
    flood: Flood | None = None


_FLOOD_HEAD = (
    b'{"id": "chatcmpl-flood", "object": "chat.completion", "model": "fake-model", '
    b'"choices": [{"index": 0, "finish_reason": "stop", '
    b'"message": {"role": "assistant", "content": "'
)
_FLOOD_TAIL = b'"}}], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}'
_FLOOD_FILLER = (b"flood " * 174763)[: 1 << 20]
FLOOD_MIN_BYTES = len(_FLOOD_HEAD) + len(_FLOOD_TAIL)
"""The smallest flood: a chat completion with empty content."""


def flood_chunks(size_bytes: int) -> Iterator[bytes | memoryview]:
    """A chat completion of exactly ``size_bytes`` bytes (at least ``FLOOD_MIN_BYTES``) whose
    content is ``flood flood …``: valid JSON when read whole, so a client can only refuse it
    for its size. Yielded in pieces of at most 1 MiB, views of one buffer: generating it
    allocates nothing per piece."""
    filler = size_bytes - FLOOD_MIN_BYTES
    if filler < 0:
        raise ValueError(f"a flood has at least {FLOOD_MIN_BYTES} bytes, got {size_bytes}")
    yield _FLOOD_HEAD
    view = memoryview(_FLOOD_FILLER)
    while filler:
        piece = view[: min(filler, len(view))]
        filler -= len(piece)
        yield piece
    yield _FLOOD_TAIL


@functools.lru_cache(maxsize=4)
def _gzipped_flood(size_bytes: int) -> bytes:
    """``flood_chunks(size_bytes)`` gzip-compressed (level 9; cached: 200 MB take 0.7 s)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts = [compressor.compress(chunk) for chunk in flood_chunks(size_bytes)]
    parts.append(compressor.flush())
    return b"".join(parts)


def _flood_pieces(flood: Flood) -> tuple[int | None, Iterator[bytes | memoryview]]:
    """``(Content-Length or None, the pieces to write)`` for ``flood``."""
    if not flood.gzip:
        return (flood.size_bytes if flood.content_length else None), flood_chunks(flood.size_bytes)
    body = memoryview(_gzipped_flood(flood.size_bytes))
    pieces = (body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20))
    return (len(body) if flood.content_length else None), pieces


_call_ids = itertools.count(1)


def chat_completion_body(
    content: str | None = None,
    tool_calls: Iterable[tuple[str, dict[str, Any] | str]] = (),
    *,
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    model: str = "fake-model",
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """An OpenAI chat completion body.

    ``tool_calls`` are ``(name, arguments)`` pairs; a dict is JSON-encoded, a str is sent as is
    (to script malformed arguments). ``finish_reason`` defaults to ``tool_calls`` when there are
    tool calls, else ``stop``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls = [
        {
            "id": f"call_fake_{next(_call_ids)}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": args if isinstance(args, str) else jsonlib.dumps(args),
            },
        }
        for name, args in tool_calls
    ]
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-fake-{next(_call_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def final_answer_responder(text: str = "Done.") -> Responder:
    """A responder that always answers ``text`` without tool calls (the default one)."""

    def respond(_body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, chat_completion_body(content=text)

    return respond


def down_base_url() -> str:
    """A ``base_url`` on 127.0.0.1 where nothing listens (connections are refused).

    The port is taken from the OS and released at once; another process could grab it in
    between, which is unlikely enough for tests.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class FakeLLMServer:
    """A scriptable OpenAI-compatible HTTP server on 127.0.0.1 (see the module docstring).

    Args:
        responder: answers requests when the queue is empty; default: the final answer "Done.".
        checks: strict-backend checks run on every request (see the module docstring).

    ``unused_ok``: set it when replies may be left over on purpose (a run stopped early);
    otherwise leaving the ``with`` block with replies still enqueued fails the test.

    Attributes:
        requests: every parsed JSON request body to ``/v1/chat/completions``, in arrival order
            (requests whose body is not JSON are recorded as ``{"_raw": <text>}``).
        headers: the request headers of each recorded request, same order (names
            case-insensitive).
        refusals: the check errors answered with 400, in order.
        flood_sent: for each flood served, in order, the body bytes written before it ended
            (the client hung up, or all of them; bytes in the sockets' buffers count as
            written).
    """

    def __init__(
        self, responder: Responder | None = None, *, checks: Iterable[RequestCheck] = ()
    ) -> None:
        self.responder: Responder = responder or final_answer_responder()
        self.checks = list(checks)
        self.refusals: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.flood_sent: list[int] = []
        self.unused_ok = False
        self._queue: deque[ScriptedReply] = deque()
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self._arrived = threading.Condition(self._lock)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind 127.0.0.1 on a free port and serve from a daemon thread. Idempotent."""
        if self._httpd is not None:
            return self
        httpd = _Server(("127.0.0.1", 0), _make_handler(self))
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hung requests, stop serving and close the socket. Idempotent."""
        httpd, self._httpd = self._httpd, None
        self._released.set()
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if exc_type is None:
            self.assert_exhausted()

    def assert_exhausted(self) -> None:
        """Fail (AssertionError) when enqueued replies were never requested (unless
        ``unused_ok``): a test's script that was not played means the run did not go the way
        the test says. Called when a ``with FakeLLMServer()`` block ends without an error."""
        with self._lock:
            left = len(self._queue)
        if left and not self.unused_ok:
            raise AssertionError(f"{left} enqueued reply(ies) of the fake LLM were never requested")

    @property
    def port(self) -> int:
        """The bound port (the server must be started)."""
        if self._httpd is None:
            raise RuntimeError("FakeLLMServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: what OpenAI clients take as base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting ---------------------------------------------------------------------------

    def enqueue(
        self,
        *,
        status: int = 200,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
        trickle_s: float = 0.0,
    ) -> None:
        """Queue one JSON answer (``json=None`` sends ``{}``) for the next request."""
        body = jsonlib.dumps({} if json is None else json).encode()
        self._push(ScriptedReply(status, body, dict(headers or {}), delay_s, trickle_s=trickle_s))

    def enqueue_text(
        self,
        text: str,
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        """Queue one raw answer (garbage bodies, HTML error pages, …) for the next request."""
        self._push(ScriptedReply(status, text.encode(), dict(headers or {}), delay_s, content_type))

    def enqueue_completion(
        self,
        content: str | None = None,
        tool_calls: Iterable[tuple[str, dict[str, Any] | str]] = (),
        **kwargs: Any,
    ) -> None:
        """Queue ``chat_completion_body(content, tool_calls, **kwargs)`` with status 200."""
        self.enqueue(json=chat_completion_body(content, tool_calls, **kwargs))

    def enqueue_flood(
        self,
        size_bytes: int,
        *,
        status: int = 200,
        content_length: bool = True,
        gzip: bool = False,
    ) -> None:
        """Queue one answer with a body of ``size_bytes`` (see ``Flood``) for the next request.
        A gzip body is compressed here, before any request (once per size)."""
        flood = Flood(size_bytes, content_length=content_length, gzip=gzip)
        if gzip:
            _gzipped_flood(size_bytes)
        self._push(ScriptedReply(status, b"", flood=flood))

    def enqueue_header_flood(self, *, value_bytes: int = 0, count: int = 0) -> None:
        """Queue one 200 chat completion ("hi") whose headers no client takes: one header
        ``X-Big`` of ``value_bytes`` bytes (aiohttp refuses a line over 8190), and ``count``
        more headers ``X-H<n>: v`` (aiohttp refuses more than 32768; real endpoints behind a
        broken proxy have sent both)."""
        headers = {f"X-H{n}": "v" for n in range(count)}
        if value_bytes:
            headers["X-Big"] = "a" * value_bytes
        self.enqueue(json=chat_completion_body("hi"), headers=headers)

    def wait_for_floods(self, count: int, timeout_s: float = 10.0) -> list[int]:
        """Block until at least ``count`` floods ended; ``flood_sent``.

        Raises:
            TimeoutError: fewer than ``count`` floods ended within ``timeout_s`` seconds.
        """
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.flood_sent) >= count, timeout_s):
                raise TimeoutError(
                    f"{len(self.flood_sent)} flood(s) ended within {timeout_s} s, expected {count}"
                )
            return list(self.flood_sent)

    @property
    def pending(self) -> int:
        """Queued answers not yet served."""
        with self._lock:
            return len(self._queue)

    def hang(self) -> None:
        """From now on, hold every request open (no answer) until ``release()`` or ``stop()``."""
        self._released.clear()

    def release(self) -> None:
        """Let held and future requests be answered again."""
        self._released.set()

    def wait_for_requests(self, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Block until at least ``count`` requests arrived (hung ones included); return them.

        Raises:
            TimeoutError: fewer than ``count`` requests arrived within ``timeout_s`` seconds.
        """
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.requests) >= count, timeout_s):
                raise TimeoutError(
                    f"{len(self.requests)} request(s) arrived within {timeout_s} s, "
                    f"expected {count}"
                )
            return list(self.requests)

    # -- serving (called from handler threads) ------------------------------------------------

    def _flooded(self, sent: int) -> None:
        with self._arrived:
            self.flood_sent.append(sent)
            self._arrived.notify_all()

    def _push(self, reply: ScriptedReply) -> None:
        with self._lock:
            self._queue.append(reply)

    def _record(self, body: dict[str, Any], headers: httpx.Headers) -> ScriptedReply | None:
        with self._arrived:
            self.requests.append(body)
            self.headers.append(headers)
            self._arrived.notify_all()
            return self._queue.popleft() if self._queue else None

    def _answer(self, body: dict[str, Any], headers: httpx.Headers) -> ScriptedReply | None:
        """The reply for one request, or ``None`` when the server stopped while it hung."""
        refusal = next((error for check in self.checks if (error := check(body))), None)
        if refusal is not None:
            with self._arrived:
                self.requests.append(body)
                self.headers.append(headers)
                self.refusals.append(refusal)
                self._arrived.notify_all()
            error = {"error": {"message": refusal, "type": "invalid_request_error", "code": 400}}
            return ScriptedReply(400, jsonlib.dumps(error).encode())
        reply = self._record(body, headers)
        self._released.wait()
        if self._httpd is None:
            return None
        if reply is not None:
            return reply
        status, payload = self.responder(body)
        return ScriptedReply(status, jsonlib.dumps(payload).encode())


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # a client that hung up (on a flood, say): nothing to report
        super().handle_error(request, client_address)


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in separate writes; with Nagle's algorithm the body then
        # waits for the client's delayed ACK (~40 ms per request on Linux)
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            if self.path.rstrip("/") != COMPLETIONS_PATH:
                self._send(ScriptedReply(404, b'{"error": {"message": "not found"}}'))
                return
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = jsonlib.loads(raw)
            except ValueError:
                body = {"_raw": raw.decode(errors="replace")}
            if not isinstance(body, dict):
                body = {"_raw": raw.decode(errors="replace")}
            # header names are case-insensitive (RFC 9110), whatever a client sends
            reply = server._answer(body, httpx.Headers(list(self.headers.items())))
            if reply is None:  # stopped while hung: drop the connection without answering
                self.close_connection = True
                return
            if reply.delay_s:
                time.sleep(reply.delay_s)
            self._send(reply)

        def _send(self, reply: ScriptedReply) -> None:
            if reply.flood is not None:
                self._flood(reply, reply.flood)
                return
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if not reply.trickle_s:
                self.wfile.write(reply.body)
                return
            for i in range(len(reply.body)):  # until the client gives up or the server stops
                if server._httpd is None:
                    return
                try:
                    self.wfile.write(reply.body[i : i + 1])
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True
                    return
                time.sleep(reply.trickle_s)

        def _flood(self, reply: ScriptedReply, flood: Flood) -> None:
            length, pieces = _flood_pieces(flood)
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            if flood.gzip:
                self.send_header("Content-Encoding", "gzip")
            if length is None:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            sent = 0
            try:
                for piece in pieces:  # until the client hangs up or the server stops
                    if server._httpd is None:
                        self.close_connection = True
                        return
                    if length is None:
                        self.wfile.write(b"%x\r\n" % len(piece))
                    self.wfile.write(piece)
                    if length is None:
                        self.wfile.write(b"\r\n")
                    sent += len(piece)
                if length is None:
                    self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client hung up: what a flood is for
                self.close_connection = True
            finally:
                server._flooded(sent)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet

    return Handler
