"""One read on one asyncpg connection of its own, without the engine: how a command that only
reads (``mana-ai agents list``) gets its rows without loading SQLAlchemy (its core, asyncio
extension and ORM: about a quarter of a second at every start).

What the connection is (the URL's keywords as SQLAlchemy's dialect makes them, the
``application_name``, the connect and statement timeouts, PgBouncer mode) is
``driver_options``, which the engine's connections are made with too
(``worker.store.engine.create_engine``). ``read_directly`` takes only the plain case (a
configured URL, at the schema's head, nothing logged at INFO) and leaves every other one to
the engine, which says what is wrong as it always has: the read is the same function of a
``Fetch`` either way (``worker.store.reads``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from worker.database_url import asyncpg_keywords, redact_url
from worker.errors import DatabaseError, ManaAIError
from worker.store.reads import Fetch, Rows
from worker.store.revision import REVISION_QUERY, revision_problem

if TYPE_CHECKING:
    from sqlalchemy.exc import DBAPIError

    from worker.settings import Settings

__all__ = ["CONNECT_TIMEOUT_S", "application_name", "driver_options", "read_directly"]

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0
"""Seconds a new connection may take (asyncpg's default is 60 s): a server that accepts the
TCP connection but never answers fails after this long."""


def application_name(worker_id: str) -> str:
    """``mana-ai/<worker id>``, the ``application_name`` of a worker's connections, so that
    ``pg_stat_activity`` shows which replica holds which; PostgreSQL keeps 63 bytes of it."""
    return f"mana-ai/{worker_id}"[:63]


def driver_options(
    *,
    application_name: str,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    statement_timeout_s: float | None,
    pgbouncer: bool,
) -> dict[str, Any]:
    """The keywords of ``asyncpg.connect`` (beside the URL's) for every connection of
    mana-ai: ``application_name`` shown in ``pg_stat_activity``, ``connect_timeout_s`` for
    the connection, ``statement_timeout_s`` for each statement's answer (asyncpg's
    ``command_timeout``; ``None``: wait for ever), and with ``pgbouncer`` no statement cache
    (PgBouncer in transaction mode may run a connection's next statement on another server
    connection)."""
    options: dict[str, Any] = {
        "server_settings": {"application_name": application_name},
        "timeout": connect_timeout_s,
    }
    if statement_timeout_s is not None:
        options["command_timeout"] = statement_timeout_s
    if pgbouncer:
        options["statement_cache_size"] = 0
    return options


async def read_directly(
    settings: Settings, read: Callable[[Fetch], Awaitable[T]]
) -> tuple[T] | None:
    """``(read's result,)`` from one asyncpg connection of its own to the configured
    database, opened as the engine opens its connections (``driver_options``), checked to be
    at the schema's head, and closed; the read runs in one transaction (so that behind
    PgBouncer its statements stay on one server connection).

    ``None`` when it leaves the read to the engine, before anything was printed: no
    ``MANA_AI_DATABASE_URL`` (the embedded database), a URL whose query names several hosts
    or ports, ``worker`` logging at INFO or below (the engine's path logs what it does), or a
    failure to connect other than the network's (the engine's path then reports it, as it
    always has: a wrong password, a database that does not exist). Once connected the read
    runs once: a failure is raised as the engine raises it (``DBAPIError``: the same words),
    never retried. A database that is not at the schema's head gets the engine's message at
    once, and what ``read`` raises as a ``ManaAIError`` (``NotFoundError``) is raised as it
    is: the same read raises it through the engine.

    Raises:
        DatabaseError: the server could not be reached (refused, no such host, no answer
            within ``CONNECT_TIMEOUT_S``), in the words of
            ``worker.store.engine.check_connection``; or the schema is not at head
            (``worker.store.revision.revision_problem``).
        ManaAIError: what ``read`` raised.
        OSError: a statement's answer did not come within ``MANA_AI_DB_STATEMENT_TIMEOUT_S``
            (``TimeoutError``), as through the engine.
        sqlalchemy.exc.DBAPIError: a statement failed once connected (cancelled, the
            connection killed, permission denied), as through the engine.
    """
    url = settings.database_url
    if url is None or logging.getLogger("worker").isEnabledFor(logging.INFO):
        return None
    keywords = asyncpg_keywords(url)
    if keywords is None:
        return None
    import asyncpg

    options = driver_options(
        application_name=application_name(settings.worker_id),
        statement_timeout_s=settings.db_statement_timeout_s,
        pgbouncer=settings.pgbouncer,
    )
    try:
        conn = await asyncpg.connect(**keywords, **options)
    except OSError as exc:  # TimeoutError too: trying again through the engine would wait twice
        from worker.store.transient import describe_error

        raise DatabaseError(
            f"could not connect to PostgreSQL at {redact_url(url)}: {describe_error(exc)}"
        ) from exc
    except Exception:
        return None
    try:
        async with conn.transaction():
            problem = revision_problem(await _revision(conn))
            if problem is not None:
                raise DatabaseError(problem)

            async def fetch(sql: str, *arguments: Any) -> Rows:
                rows: Rows = await conn.fetch(sql, *arguments)
                return rows

            return (await read(fetch),)
    except (ManaAIError, OSError):  # the read's refusal (NotFoundError), the schema's, or a
        raise  # statement that timed out: said as through the engine
    except Exception as error:  # once connected, never again: a cancelled or killed read is
        wrapped = _as_engine_error(error)  # not redone; said as the engine says it
        if wrapped is None:
            raise
        raise wrapped from wrapped.orig
    finally:
        try:
            await conn.close()
        except Exception:  # gone already: nothing to say goodbye to
            conn.terminate()


def _as_engine_error(error: Exception) -> DBAPIError | None:
    """``error`` (asyncpg's) as the engine raises it for a statement
    (``worker.store.dbapi_errors.as_dbapi_error``), so that the command says it in the same words
    (``worker.store.transient.describe_error``); ``None`` when SQLAlchemy passes it through.
    SQLAlchemy is loaded only here, on the way out."""
    from sqlalchemy.dialects.postgresql.asyncpg import dialect

    from worker.store.dbapi_errors import as_dbapi_error

    dbapi = dialect.import_dbapi()  # type: ignore[no-untyped-call]
    return as_dbapi_error(dialect(dbapi=dbapi), error)  # type: ignore[no-untyped-call]


async def _revision(conn: Any) -> str | None:
    """The schema revision, as ``worker.store.migrate.current_revision`` reads it: the row
    of ``alembic_version``; ``None`` when it has none or there is no such table."""
    from asyncpg.exceptions import UndefinedTableError

    try:
        value = await conn.fetchval(REVISION_QUERY)
    except UndefinedTableError:
        return None
    return None if value is None else str(value)
