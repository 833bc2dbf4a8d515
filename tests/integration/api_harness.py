"""The HTTP API and console of ``mana-ai serve`` in-process (``httpx`` over the ASGI app, no
socket) on the test database, with admin tokens: shared by the API and console tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.api.app import build_app
from worker.queries.admin_tokens import AdminTokenStore
from worker.settings import Settings
from worker.tools import builtin_tool_catalog

__all__ = ["BASE", "api_client", "token"]

BASE = "http://testserver"


def app_for(engine: AsyncEngine, database_url: str, **settings: Any) -> Any:
    catalog = builtin_tool_catalog()
    config = Settings(database_url=database_url, **settings)
    return build_app(
        engine,
        config,
        known_tools=[t.name for t in catalog],
        hints={t.name: t.policy_hint for t in catalog},
    )


@asynccontextmanager
async def api_client(
    engine: AsyncEngine, database_url: str, bearer: str | None = None, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app (``bearer``: sent as ``Authorization: Bearer``)."""
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    transport = httpx.ASGITransport(app=app_for(engine, database_url, **settings))
    async with httpx.AsyncClient(transport=transport, base_url=BASE, headers=headers) as client:
        yield client


async def token(engine: AsyncEngine, name: str = "alice", *, read_only: bool = False) -> str:
    _, value = await AdminTokenStore(engine).create_token(name, read_only=read_only)
    return value
