"""An ASGI app served over HTTP by uvicorn on a socket bound up front: what `mana-ai serve`
(the HTTP API and console) and `mana-ai mcp serve` (MCP over streamable HTTP) run.

The socket is bound and listening when the object is made (``port`` 0 picks a free one: read
``.port``), so a client may connect before ``serve()`` runs, and a port in use fails at once
(``OSError``), before anything is printed. ``serve()`` runs until ``stop()`` (or uvicorn's own
SIGTERM/SIGINT handling); open requests get ``GRACE_S`` seconds.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

from worker.errors import SettingsError

__all__ = ["GRACE_S", "AsgiServer", "HttpMiddleware", "ResponseWatch", "cannot_listen"]

GRACE_S = 5
"""Seconds open requests get to finish once the server is asked to stop."""


def cannot_listen(exc: OSError, host: str, port: int, prefix: str) -> SettingsError:
    """The settings error of an address the server could not bind (``exc``), naming the
    variables ``{prefix}_HOST`` / ``{prefix}_PORT`` (``MANA_AI_API``): exit status 2, as any
    invalid setting."""
    return SettingsError(
        f"{prefix}_HOST / {prefix}_PORT: cannot listen on {host}:{port} "
        f"({exc.strerror or exc}); set another address or port (0 picks a free one)"
    )


class HttpMiddleware:
    """Base of a pure ASGI middleware around ``app`` that acts on HTTP requests only
    (``handle``); lifespan and other scopes pass through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """One HTTP request (override)."""
        await self.app(scope, receive, send)


class ResponseWatch:
    """An ASGI ``send`` that passes every message on and notes whether the response began
    (``started``) and its ``status`` (500 until then): what a middleware needs to know whether
    it may still answer an exception itself."""

    def __init__(self, send: Any) -> None:
        self.send = send
        self.started = False
        self.status = 500

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
        await self.send(message)


class AsgiServer:
    """``app`` served on ``host:port`` (see the module docstring).

    Raises:
        OSError: the address cannot be bound (in use, not on this host).
    """

    def __init__(self, app: Any, host: str, port: int) -> None:
        self.app = app
        self.host = host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
            self._socket.listen(128)
        except OSError:
            self._socket.close()
            raise
        self.port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=GRACE_S,
        )
        self._server = uvicorn.Server(config)

    @property
    def base_url(self) -> str:
        """``http://host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def serve(self) -> None:
        """Serve until stopped; the socket is closed afterwards."""
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            self._socket.close()

    async def serve_until_signalled(self, announce: str) -> None:
        """Serve until SIGTERM or SIGINT (each stops the server gracefully, and the command
        then ends with status 0 as ``worker`` does), printing ``announce`` on stderr once the
        handlers are in place: the line tells a supervisor it may stop the server."""
        import asyncio
        import signal
        import sys

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        print(announce, file=sys.stderr, flush=True)
        try:
            await self.serve()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def close(self) -> None:
        """Close the socket of a server that will not ``serve()``."""
        self._socket.close()

    def stop(self) -> None:
        """Ask ``serve()`` to finish (open requests get ``GRACE_S`` seconds)."""
        self._server.should_exit = True

    @property
    def started(self) -> bool:
        """True once uvicorn has started (the app's lifespan ran)."""
        return bool(self._server.started)
