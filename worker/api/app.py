"""`mana-ai serve`: one ASGI app (Starlette) with the JSON API under ``/api/v1``
(``worker.api.v1``), the web console under ``/`` (``worker.api.console``), ``/healthz`` and
``/metrics``.

What every response gets (``SecurityHeaders``): a strict Content-Security-Policy (``default-src
'self'``; scripts, styles, images and forms of this server only; no inline script or style, no
frames), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: same-origin`` and
``X-Frame-Options: DENY``. What every request gets: a body of at most
``MANA_AI_API_MAX_BODY_BYTES`` (``BodyLimit``: a larger one is answered 413 without being
read).

Errors: the API answers ``{"error": {"status", "message"}}`` with 400 (malformed or refused:
``UsageError``, a bad schedule), 401 (not signed in), 403 (not allowed), 404 (no such thing),
409 (it clashes: ``ConflictError``), 413, 422 (an iteration that cannot be replayed) and 503
(the database does not answer); the console shows the same as a page. A 500 never shows a
traceback, and nothing about another user's data leaks through an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import generate_latest
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker import redaction
from worker.admin.replay import ReplayError
from worker.api import console, v1
from worker.api.auth import Forbidden, Unauthorized
from worker.api.openapi import openapi_document
from worker.api.services import Services
from worker.asgi_server import HttpMiddleware, ResponseWatch
from worker.db.transient import describe_error, is_transient
from worker.errors import ConflictError, ManaAIError, NotFoundError, UsageError
from worker.mcp.serve_health import DatabaseHealth, ping_database
from worker.schedule import ScheduleError
from worker.settings import Settings

__all__ = ["CONTENT_SECURITY_POLICY", "BodyLimit", "SecurityHeaders", "build_app"]

logger = logging.getLogger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)

_SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders(HttpMiddleware):
    """Adds the module docstring's headers to every HTTP response."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyLimit(HttpMiddleware):
    """Answers 413 to a request whose body is larger than ``max_bytes``: at once when its
    ``Content-Length`` says so, else as soon as what it streams passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await _too_large(self.max_bytes, scope, send)
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        watch = ResponseWatch(send)
        try:
            await self.app(scope, counted, watch)
        except _TooLarge:
            if not watch.started:
                await _too_large(self.max_bytes, scope, send)


class Errors(HttpMiddleware):
    """Answers an exception no handler took (a bug) as the module docstring says, logged with
    its traceback, instead of letting it reach the server (which would log it again and drop
    the keep-alive connection). One raised after the response started is re-raised."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch)
        except ClientDisconnect:  # nobody to answer, nothing wrong here
            logger.debug("%s %s: the client went away", scope["method"], scope["path"])
        except Exception as exc:
            if watch.started or isinstance(exc, _TooLarge):
                raise
            response = await _handle(Request(scope), exc)
            await response(scope, _no_body, send)


class _TooLarge(Exception):
    pass


async def _too_large(max_bytes: int, scope: Scope, send: Send) -> None:
    response = _error(413, f"the body is larger than {max_bytes} bytes")
    await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return v1.VisibleJSONResponse(
        {"error": {"status": status, "message": message}}, status_code=status, headers=headers
    )


def _status_of(exc: Exception) -> int:
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, UsageError | ScheduleError):
        return 400
    if isinstance(exc, ReplayError):
        return 422
    if isinstance(exc, HTTPException):
        return exc.status_code
    return 503 if is_transient(exc) else 500


async def _handle(request: Request, exc: Exception) -> Response:
    """Every error as the module docstring says: JSON under ``/api``, a page elsewhere."""
    status = _status_of(exc)
    if status == 500:  # a bug, or the database refused what it was sent: log it whole
        logger.error(
            "%s %s failed: %s", request.method, request.url.path, describe_error(exc), exc_info=exc
        )
        message = "mana-ai failed to answer this request (the server's log says why)"
    elif status == 503:
        logger.warning("request %s failed: the database: %s", request.url.path, describe_error(exc))
        message = "the database does not answer; try again shortly"
    elif isinstance(exc, HTTPException):
        message = str(exc.detail)
    else:
        message = str(exc)
    headers = {"Retry-After": "5"} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, HTTPException) and exc.headers:  # 405's Allow (RFC 9110 15.5.6)
        headers = {**(headers or {}), **exc.headers}
    if request.url.path.startswith("/api/"):
        return _error(status, message, headers)
    env = request.app.state.templates
    if request.headers.get("hx-request") == "true":  # a console button: say it at the top
        message = redaction.redact(message)
        fragment = env.get_template("error_notice.html").render(status=status, message=message)
        headers = {**(headers or {}), "HX-Retarget": "#flash", "HX-Reswap": "innerHTML"}
        return HTMLResponse(fragment, status_code=status, headers=headers)
    message = redaction.redact(message)
    html = env.get_template("error.html").render(status=status, message=message, request=request)
    return HTMLResponse(html, status_code=status, headers=headers)


def _healthz(health: DatabaseHealth) -> Callable[[Request], Any]:
    async def healthz(request: Request) -> Response:
        problem = await health.problem()
        if problem is None:
            return JSONResponse({"status": "ok"})
        return JSONResponse(
            {"status": "unavailable", "error": problem},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    return healthz


SERVE_REGISTRY = CollectorRegistry()
"""What ``/metrics`` of `mana-ai serve` exports: its process (CPU, memory, open files, GC)
and its requests; not the workers' mission figures, which would read 0 here."""
ProcessCollector(registry=SERVE_REGISTRY)
PlatformCollector(registry=SERVE_REGISTRY)
GCCollector(registry=SERVE_REGISTRY)
API_REQUESTS = Counter(
    "mana_ai_api_requests",
    "Requests `mana-ai serve` answered, by method ('other' for a method it does not serve), "
    "route template (/api/v1/missions/{id}; 'other' for no route) and status code (499: the "
    "client went away before the answer).",
    ["method", "route", "status"],
    registry=SERVE_REGISTRY,
)
API_REQUEST_SECONDS = Histogram(
    "mana_ai_api_request_duration_seconds",
    "Seconds from a request's arrival to the end of its answer, by route template.",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=SERVE_REGISTRY,
)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods counted by name; any other is ``other`` (a client picks the method: named as it
is, each made-up one would be a new series)."""


class RequestMetrics(HttpMiddleware):
    """Counts and times every HTTP request (``API_REQUESTS``, ``API_REQUEST_SECONDS``) by its
    route's template, so ids do not make a series each."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "other"
            if template.startswith("/static"):
                template = "/static"
            method = scope["method"] if scope["method"] in _METHODS else "other"
            # no answer started: the client went away first (nginx's 499)
            status = str(watch.status) if watch.started else "499"
            API_REQUESTS.labels(method, template, status).inc()
            API_REQUEST_SECONDS.labels(template).observe(time.perf_counter() - started)


async def _metrics(request: Request) -> Response:
    return Response(generate_latest(SERVE_REGISTRY), media_type=CONTENT_TYPE_LATEST)


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


async def _not_found(request: Request, exc: Exception) -> Response:
    return await _handle(request, NotFoundError(f"no such page: {request.url.path}"))


def build_app(
    engine: AsyncEngine,
    settings: Settings,
    *,
    known_tools: list[str],
    hints: dict[str, str],
    health: DatabaseHealth | None = None,
) -> Starlette:
    """The app of ``mana-ai serve`` on ``engine`` (see the module docstring).

    Args:
        known_tools: the built-in tools' names (agents' tool lists are checked against them).
        hints: the tools' policy hints by name (the timeline groups parallel reads by them).
        health: what ``/healthz`` asks (default: ``SELECT 1`` on ``engine``, cached 1 s).
    """
    health = health or DatabaseHealth(lambda: ping_database(engine), who="HTTP API")
    app = Starlette(
        routes=[
            Route("/healthz", _healthz(health), methods=["GET"]),
            Route("/metrics", _metrics, methods=["GET"]),
            Route("/api/v1/openapi.json", _openapi, methods=["GET"]),
            *v1.routes(),
            *console.routes(),
        ],
        middleware=[
            Middleware(RequestMetrics),
            Middleware(SecurityHeaders),
            Middleware(BodyLimit, max_bytes=settings.api.max_body_bytes),
            Middleware(Errors),
        ],
        exception_handlers={
            404: _not_found,
            HTTPException: _handle,
            ManaAIError: _handle,
            SQLAlchemyError: _handle,
            OSError: _handle,
        },
    )
    app.router.redirect_slashes = False  # its redirect is built from the client's Host
    app.state.services = Services(settings=settings, engine=engine, known_tools=known_tools)
    app.state.templates = console.templates()
    app.state.hints = hints
    return app
