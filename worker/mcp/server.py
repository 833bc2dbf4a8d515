"""``mana-ai mcp serve``: the built-in tools for MCP clients, over streamable HTTP or stdio.

Built on the official ``mcp`` SDK: its low-level ``Server`` (``tools/list`` and
``tools/call`` handlers over ``ServedTools``), its streamable HTTP session manager, and its
bearer-token middleware (``BearerAuthBackend`` + ``RequireAuthMiddleware``) with a
``TokenVerifier`` over ``mcp_tokens``: a request without a live token gets 401 before any MCP
message is read, so nothing runs. ``/metrics`` (Prometheus) and ``/healthz`` are served beside
``/mcp`` without a token (counts only, as the worker's metrics endpoint); ``/healthz`` says
503 while the database does not answer, and a request that fails for a database fault gets
503 too (``worker.mcp.serve_health``).

Over stdio (``--stdio --user USER``) there is no token: whoever can start the process with the
database's URL is trusted to act for USER, and the same gate applies to every call.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY
from prometheus_client.exposition import generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.asgi_server import AsgiServer
from worker.mcp.consumer import ServedTools
from worker.mcp.serve_health import DatabaseFaults, DatabaseHealth, ping_database
from worker.queries.mcp_tokens import McpPrincipal, McpStore, hash_token
from worker.version import package_version

__all__ = ["McpHttpServer", "StoreTokenVerifier", "build_mcp_server", "serve_stdio"]

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
INSTRUCTIONS = (
    "mana-ai's tools for your user: notes (list, search, read, create, update, delete), the "
    "clock and, when exposed, web_fetch. Every call passes mana-ai's policy gate: destructive "
    "tools need the user's opt-in, each tool is rate-limited per user, and a refused call "
    "answers with the reason."
)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class StoreTokenVerifier:
    """The SDK's ``TokenVerifier`` over ``mcp_tokens``: a live token gives an ``AccessToken``
    whose ``subject`` is its user and ``client_id`` its id (``token:ID``); anything else gives
    ``None`` (401). The ``AccessToken`` carries the token's hash, never the token."""

    def __init__(self, store: McpStore) -> None:
        self.store = store

    async def verify_token(self, token: str) -> AccessToken | None:
        principal = await self.store.token_principal(token)
        if principal is None:
            logger.warning("MCP request refused (401): unknown or revoked bearer token")
            return None
        return AccessToken(
            token=hash_token(token),
            client_id=f"token:{principal.token_id}",
            scopes=[],
            subject=principal.user_id,
            claims={"token_id": principal.token_id},
        )


def _http_principal(ctx: ServerRequestContext[Any, Any]) -> McpPrincipal:
    """The principal of an HTTP request (authenticated by the middleware before it reached
    the MCP layer)."""
    request = ctx.request
    user = request.scope.get("user") if isinstance(request, Request) else None
    if not isinstance(user, AuthenticatedUser) or user.access_token.subject is None:
        raise PermissionError("this request carries no authenticated user")  # never expected
    claims = user.access_token.claims or {}
    return McpPrincipal(user_id=user.access_token.subject, token_id=claims.get("token_id"))


def build_mcp_server(served: ServedTools, *, stdio_user: str | None = None) -> Server[Any]:
    """The SDK's low-level ``Server`` over ``served``: ``tools/list`` gives the exposed tools,
    ``tools/call`` runs ``served.call`` for the request's principal (``stdio_user`` over stdio,
    else the bearer token's user)."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=served.listing())

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        principal = McpPrincipal(stdio_user) if stdio_user is not None else _http_principal(ctx)
        call_id = None if ctx.request_id is None else f"mcp-{ctx.request_id}"
        return await served.call(principal, params.name, params.arguments, call_id=call_id)

    return Server(
        "mana-ai",
        version=package_version(),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=served.input_schema,
    )


async def serve_stdio(served: ServedTools, *, user: str) -> None:
    """Serve MCP on this process's stdin/stdout for ``user`` until the client closes stdin."""
    from mcp.server.stdio import stdio_server

    server = build_mcp_server(served, stdio_user=user)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def _metrics(request: Request) -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _healthz(health: DatabaseHealth) -> Callable[[Request], Awaitable[Response]]:
    """``/healthz``: 200 ``{"status": "ok"}`` while the server can serve, 503 ``{"status":
    "unavailable", "error": "…"}`` while its database does not answer
    (``worker.mcp.serve_health``). It has no tick to judge, unlike the worker's
    (``worker.metrics.HealthState``), whose body has the same ``status`` when it is well."""

    async def healthz(request: Request) -> Response:
        problem = await health.problem()
        if problem is None:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "error": problem}, status_code=503)

    return healthz


def build_http_app(
    served: ServedTools, store: McpStore, *, host: str, health: DatabaseHealth | None = None
) -> Starlette:
    """The ASGI app of ``mcp serve``: ``/mcp`` behind bearer tokens, ``/metrics``,
    ``/healthz``. Bound to a loopback ``host``, requests must also name a loopback host and
    origin (the SDK's DNS-rebinding protection). ``/healthz`` asks ``health`` (default: a
    ``DatabaseHealth`` of ``store``'s database); a request that fails for a database fault
    answers 503 (``DatabaseFaults``)."""
    if health is None:
        engine = store.engine
        health = DatabaseHealth(lambda: ping_database(engine))
    server = build_mcp_server(served)
    security = None
    if host in _LOOPBACK:
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    sessions = StreamableHTTPSessionManager(app=server, security_settings=security)
    authenticate = BearerAuthBackend(StoreTokenVerifier(store))
    endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(sessions), required_scopes=[])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with sessions.run():
            yield

    return Starlette(
        routes=[
            Route(MCP_PATH, endpoint=endpoint),
            Route("/metrics", endpoint=_metrics),
            Route("/healthz", endpoint=_healthz(health)),
        ],
        middleware=[
            Middleware(DatabaseFaults),
            Middleware(AuthenticationMiddleware, backend=authenticate),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lifespan,
    )


class McpHttpServer(AsgiServer):
    """``mcp serve`` over streamable HTTP on ``host:port`` (``worker.asgi_server.AsgiServer``:
    bound when made, ``port`` 0 picks a free one; ``serve()`` until ``stop()``)."""

    @property
    def url(self) -> str:
        """The MCP endpoint, e.g. ``http://127.0.0.1:8765/mcp``."""
        return f"{self.base_url}{MCP_PATH}"
