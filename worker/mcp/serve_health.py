"""Whether ``mana-ai mcp serve`` can serve, and what a client gets when its database fails.

Every MCP request needs the database (its bearer token is looked up in ``mcp_tokens``, every
call is recorded in ``tool_invocations``), so a server whose database is unreachable cannot
serve, and says so:

* ``/healthz`` (``DatabaseHealth``) runs ``SELECT 1`` on the server's pool within
  ``HEALTH_TIMEOUT_S`` and keeps the verdict ``HEALTH_CACHE_S``; concurrent probes share one
  check, so a probe storm costs one statement a second at most. Unreachable: 503 with a body
  that names the cause by its kind (``ConnectionRefusedError``, no answer in time) but not
  the database's address, since the endpoint needs no token; the details go to the log, once
  per change of verdict.
* a request that fails for a transient database fault before its answer started (the
  token's lookup, most often) answers 503 with a JSON-RPC error (``DatabaseFaults``) and
  ``Retry-After``, logged as one warning line with the cause (``describe_error``): not a bare
  500 with a traceback in the log. Other failures are left to the server's own handling.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import Receive, Scope, Send

from worker.asgi_server import HttpMiddleware, ResponseWatch
from worker.db.transient import describe_error, is_transient

__all__ = [
    "HEALTH_CACHE_S",
    "HEALTH_TIMEOUT_S",
    "RETRY_AFTER_S",
    "DatabaseFaults",
    "DatabaseHealth",
    "ping_database",
]

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
"""Seconds ``SELECT 1`` may take before ``/healthz`` calls the database unreachable."""
HEALTH_CACHE_S = 1.0
"""Seconds a verdict of ``DatabaseHealth`` is reused."""
RETRY_AFTER_S = 5
"""``Retry-After`` of a 503 answered for a database fault, in seconds."""
UNAVAILABLE = -32000
"""The JSON-RPC error code of that answer (implementation-defined server error, JSON-RPC 2.0
§5.1)."""


async def ping_database(engine: AsyncEngine) -> None:
    """``SELECT 1`` on a connection of ``engine``'s pool (raises what the driver raises)."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


class DatabaseHealth:
    """Whether the database answers, judged at most every ``cache_s`` (see the module
    docstring).

    Args:
        ping: one check; raises when the database does not answer (``ping_database``).
        timeout_s: seconds a check may take (default ``HEALTH_TIMEOUT_S``).
        cache_s: seconds a verdict is reused (default ``HEALTH_CACHE_S``).
        clock: monotonic seconds (default ``time.monotonic``); tests pass their own.
        who: the server its log lines name (default ``MCP server``).
    """

    def __init__(
        self,
        ping: Callable[[], Awaitable[None]],
        *,
        timeout_s: float = HEALTH_TIMEOUT_S,
        cache_s: float = HEALTH_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
        who: str = "MCP server",
    ) -> None:
        self._ping = ping
        self.who = who
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._clock = clock
        self._checked_at: float | None = None
        self._problem: str | None = None
        self._running: asyncio.Future[str | None] | None = None
        self.checks = 0
        """Checks run so far."""

    async def problem(self) -> str | None:
        """``None`` when the database answered (now, or within ``cache_s``), else why not,
        in words fit for anyone (no address, no credentials)."""
        if self._checked_at is not None and self._clock() - self._checked_at < self.cache_s:
            return self._problem
        if self._running is None:
            self._running = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._running)

    async def _check(self) -> str | None:
        self.checks += 1
        detail = None
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._ping()
            problem = None
        except TimeoutError:
            problem = detail = f"the database did not answer within {self.timeout_s:g} s"
        except Exception as exc:
            problem = f"the database is unreachable ({type(_root(exc)).__name__})"
            detail = f"the database is unreachable: {describe_error(exc)}"
        finally:
            self._running = None
        if problem != self._problem:
            if problem is None:
                logger.info("%s: the database answers again", self.who)
            else:
                logger.warning("%s: /healthz answers 503: %s", self.who, detail)
        self._problem, self._checked_at = problem, self._clock()
        return problem


def _root(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


class DatabaseFaults(HttpMiddleware):
    """ASGI middleware: a request whose handling raised a transient database failure
    (``worker.db.transient.is_transient``) before its answer started gets 503 with a JSON-RPC
    error and ``Retry-After``, and the log one warning line (see the module docstring)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if watch.started or not is_transient(exc):
                raise
            logger.warning(
                "MCP request %s %s answered 503: the database is unavailable (%s)",
                scope.get("method", ""),
                scope.get("path", ""),
                describe_error(exc),
            )
            await _unavailable(send)


async def _unavailable(send: Send) -> None:
    error = {
        "code": UNAVAILABLE,
        "message": "mana-ai's database is unavailable; try again later",
    }
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
