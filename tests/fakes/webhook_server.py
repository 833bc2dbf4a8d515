"""FakeWebhook: a real HTTP listener on 127.0.0.1 that takes POSTs (an approval webhook).

It answers each POST with the next status of its script (then 200), with ``hold=True`` only
once ``release()`` was called (a slow webhook), and records every body it got (``bodies``,
parsed JSON). ``received(n)`` waits until ``n`` POSTs arrived. Like the other fakes it runs
stdlib ``ThreadingHTTPServer`` in a daemon thread on an OS-assigned port.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["FakeWebhook"]


class FakeWebhook:
    """See the module docstring. ``statuses``: the answers to the first POSTs, in order."""

    def __init__(self, statuses: Iterable[int] = (), *, hold: bool = False) -> None:
        self.statuses: deque[int] = deque(statuses)
        self._released = threading.Event()
        if not hold:
            self._released.set()
        self.bodies: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self._arrived = threading.Condition()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with webhook._arrived:
                    status = webhook.statuses.popleft() if webhook.statuses else 200
                    webhook.bodies.append(json.loads(body or b"null"))
                    webhook.headers.append(dict(self.headers))
                    webhook._arrived.notify_all()
                webhook._released.wait(60)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def release(self) -> None:
        """Let held answers go (and every later one)."""
        self._released.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    async def received(self, count: int, timeout_s: float = 30.0) -> list[Any]:
        """The bodies once ``count`` POSTs arrived (TimeoutError after ``timeout_s``)."""

        def wait() -> bool:
            with self._arrived:
                return self._arrived.wait_for(lambda: len(self.bodies) >= count, timeout_s)

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"{len(self.bodies)} of {count} POSTs arrived")
        return list(self.bodies)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
