"""Opening the configured database for a process: the engine of the configured URL (or the
embedded PostgreSQL), checked to answer and to be at the schema's head, and the name its
connections show in ``pg_stat_activity``.

It sits in the store so that a command which only needs the database (``agents``,
``missions``, ``iterations``, ``db``) opens it without importing the daemon (the run, the MCP
SDK, the tools): those commands start in about half the time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncEngine

from worker.errors import DatabaseError
from worker.settings import Settings
from worker.store.direct import application_name
from worker.store.engine import check_connection, create_engine, resolve_database_url
from worker.store.migrate import current_revision, upgrade_database
from worker.store.revision import revision_problem

__all__ = ["application_name", "configured_engine", "open_database"]


@asynccontextmanager
async def open_database(
    settings: Settings, *, migrate: bool | None = None, pool_size: int | None = None
) -> AsyncIterator[AsyncEngine]:
    """An engine for the configured (or embedded) database, disposed on exit.

    Args:
        migrate: ``True`` upgrades the schema to head (under the advisory lock); ``False``
            requires it to be at head already; ``None`` (default) migrates the embedded
            database and requires an external one to be migrated.
        pool_size: connections kept open (default ``MANA_AI_DB_POOL_SIZE``).

    Raises:
        DatabaseError: the database is unreachable, or not migrated when ``migrate`` is false.
    """
    url = await resolve_database_url(settings)
    engine = configured_engine(
        settings, url, pool_size=pool_size or settings.db_pool_size, max_overflow=None
    )
    try:
        await check_connection(engine)
        if migrate is None:
            migrate = settings.database_url is None
        if migrate:
            await upgrade_database(engine)
        else:
            problem = revision_problem(await current_revision(engine))
            if problem is not None:
                raise DatabaseError(problem)
        yield engine
    finally:
        await engine.dispose()


def configured_engine(
    settings: Settings, url: str, *, pool_size: int = 1, max_overflow: int | None = 0
) -> AsyncEngine:
    """An engine on ``url`` as the settings configure every connection of this worker
    (PgBouncer mode, ``application_name``, statement timeout): ``pool_size`` connections,
    ``max_overflow`` more at most (``None``: ``MANA_AI_DB_MAX_OVERFLOW``)."""
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=settings.db_max_overflow if max_overflow is None else max_overflow,
        pgbouncer=settings.pgbouncer,
        application_name=application_name(settings.worker_id),
        statement_timeout_s=settings.db_statement_timeout_s,
    )
