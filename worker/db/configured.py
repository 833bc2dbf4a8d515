"""Opening the configured database for a process: the engine of the configured URL (or the
embedded PostgreSQL), checked to answer and to be at the schema's head, and the name its
connections show in ``pg_stat_activity``.

A process that starts and then runs for a while (``worker``, ``tick``, ``serve``, ``mcp
serve``) waits for its database (``MANA_AI_DB_START_WAIT_S``, ``wait_s`` below): every round
trip of its start that fails for a transient fault (``worker.db.transient``: refused,
reset, the server starting or shutting down, an answer lost) is tried again with backoff
until the wait is over, as a running worker retries its statements. A command run by hand
(``agents list``) fails at once.

It sits in the store so that a command which only needs the database (``agents``,
``missions``, ``iterations``, ``db``) opens it without importing the daemon (the run, the MCP
SDK, the tools): those commands start in about half the time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.database_url import redact_url
from worker.db.engine import (
    application_name,
    check_connection,
    create_engine,
    resolve_database_url,
)
from worker.db.migrate import current_revision, upgrade_database
from worker.db.revision import revision_problem
from worker.db.transient import describe_error, is_transient, retry_transient
from worker.errors import DatabaseError
from worker.settings import Settings

__all__ = ["application_name", "configured_engine", "open_database", "wait_for_database"]


@asynccontextmanager
async def open_database(
    settings: Settings,
    *,
    migrate: bool | None = None,
    pool_size: int | None = None,
    wait_s: float = 0.0,
) -> AsyncIterator[AsyncEngine]:
    """An engine for the configured (or embedded) database, disposed on exit.

    Args:
        migrate: ``True`` upgrades the schema to head (under the advisory lock); ``False``
            requires it to be at head already; ``None`` (default) migrates the embedded
            database and requires an external one to be migrated.
        pool_size: connections kept open (default ``MANA_AI_DB_POOL_SIZE``).
        wait_s: seconds to wait for the database (``MANA_AI_DB_START_WAIT_S`` for a process
            that starts): each round trip of the opening (a connection and its check, the
            read of the schema's revision, the migration) that fails for a transient fault
            is tried again with backoff (``retry_transient``, a log line per attempt) until
            ``wait_s`` seconds after the call. 0 (the default): no retry.

    Raises:
        DatabaseError: the database is unreachable (after ``wait_s``: the message says it
            waited), refuses the connection for good (a wrong password, no such database: at
            once), or is not migrated when ``migrate`` is false, or at a revision newer
            than this mana-ai's (at once). The message names the database without its
            password and what failed.
    """
    url = await resolve_database_url(settings)
    engine = configured_engine(
        settings, url, pool_size=pool_size or settings.database.pool_size, max_overflow=None
    )
    deadline = time.monotonic() + wait_s
    try:
        try:
            await check_connection(engine, wait_s=_left(deadline))
            if migrate is None:
                migrate = settings.database.url is None
            if migrate:
                await upgrade_database(engine, wait_s=_left(deadline))
            else:
                problem = revision_problem(await _revision(engine, deadline))
                if problem is not None:
                    raise DatabaseError(problem)
        except DatabaseError as exc:
            raise _after_waiting(exc, wait_s) from exc.__cause__
        yield engine
    finally:
        await engine.dispose()


async def wait_for_database(settings: Settings, *, wait_s: float | None = None) -> None:
    """Return once the configured database answers, retrying transient failures (refused,
    reset, the server starting up) with backoff for up to ``wait_s`` seconds (``None``:
    ``MANA_AI_DB_START_WAIT_S``), a log line per attempt (``check_connection``): a process
    started during an outage, or before its database in a deployment, rides it out as a
    running one does. The embedded database (``MANA_AI_DATABASE_URL`` unset) is started, not
    waited for: nothing to do.

    Raises:
        DatabaseError: still unreachable after ``wait_s`` (the message says it waited), or a
            failure that is not transient (at once): the error ``open_database`` gives.
    """
    if settings.database.url is None:
        return
    wait_s = settings.database.start_wait_s if wait_s is None else wait_s
    engine = configured_engine(settings, settings.database.url)
    try:
        await check_connection(engine, wait_s=wait_s)
    except DatabaseError as exc:
        raise _after_waiting(exc, wait_s) from exc.__cause__
    finally:
        await engine.dispose()


def _left(deadline: float) -> float:
    """Seconds from now to ``deadline`` (a ``time.monotonic()`` value), at least 0."""
    return max(0.0, deadline - time.monotonic())


def _after_waiting(exc: DatabaseError, wait_s: float) -> DatabaseError:
    """``exc``, saying that the start waited ``wait_s`` seconds when it was caused by a
    transient failure (it was retried all that time)."""
    cause = exc.__cause__
    if wait_s <= 0 or cause is None or not is_transient(cause):
        return exc
    return DatabaseError(f"{exc} (retried for {wait_s:g} s: MANA_AI_DB_START_WAIT_S)")


async def _revision(engine: AsyncEngine, deadline: float) -> str | None:
    """``current_revision(engine)``, transient failures retried until ``deadline`` (a
    ``time.monotonic()`` value).

    Raises:
        DatabaseError: it could not be read; the message names the database.
    """
    where = redact_url(engine.url.render_as_string(hide_password=False))
    try:
        return await retry_transient(
            lambda: current_revision(engine),
            deadline=deadline,
            what=f"reading the schema revision of {where}",
        )
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseError(
            f"could not read the schema revision of {where}: {describe_error(exc)}"
        ) from exc


def configured_engine(
    settings: Settings, url: str, *, pool_size: int = 1, max_overflow: int | None = 0
) -> AsyncEngine:
    """An engine on ``url`` as the settings configure every connection of this worker
    (PgBouncer mode, ``application_name``, statement timeout): ``pool_size`` connections,
    ``max_overflow`` more at most (``None``: ``MANA_AI_DB_MAX_OVERFLOW``)."""
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=settings.database.max_overflow if max_overflow is None else max_overflow,
        pgbouncer=settings.database.pgbouncer,
        application_name=application_name(settings.daemon.worker_id),
        statement_timeout_s=settings.database.statement_timeout_s,
    )
