"""Database URLs and the async engine: one connection pool, single statements, errors.

The worker talks to PostgreSQL through SQLAlchemy's asyncio layer over asyncpg only, so every
URL is normalised to ``postgresql+asyncpg://`` here (``to_async_url``). With no URL configured,
``resolve_database_url`` starts the embedded PostgreSQL (``worker.db.embedded``).

The pool (``create_engine``): every store method takes a connection for one short transaction
and gives it back, so a pool of 10 serves hundreds of running missions. The pool hands out the
connection given back last (``pool_use_lifo``): under a light load the same few connections
serve every statement with their backends warm, and the others stay idle, for the server or
PgBouncer to close (``bench/db_floor.py`` at concurrency 4: 746-876 against 670-801 missions
per second). A connection idle in the pool for ``PING_AFTER_IDLE_S`` or more is pinged when
taken (a restarted server then costs a reconnect, not an error); one used within that time is
not (a ping on asyncpg costs three round trips). A connection asyncpg knows is closed is
replaced when taken. This is SQLAlchemy's documented pessimistic disconnect handling with a
``checkout`` event in place of ``pool_pre_ping``. Connections are recycled after 30 minutes.
A failover (an error saying the server no longer takes writes: ``worker.db.transient``'s
``server_gone``) discards the connection and every one pooled before it, so the next statement
connects afresh, to the new primary with a multi-host URL and ``target_session_attrs``.
A statement that times out leaves its connection out of the pool if it does not answer its
reset either. With ``pgbouncer=True`` asyncpg's and SQLAlchemy's prepared-statement caches are
off and every prepared statement gets a unique name, as SQLAlchemy's asyncpg dialect documents
("Prepared Statement Name with PGBouncer").
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text
from sqlalchemy.engine import CursorResult, ExceptionContext, RowMapping
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InternalError,
    SQLAlchemyError,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from worker.database_url import redact_url, to_async_url
from worker.db.transient import describe_error, retry_transient, server_gone
from worker.errors import DatabaseError

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "CONNECT_TIMEOUT_S",
    "application_name",
    "behind_pgbouncer",
    "check_connection",
    "connection_broken",
    "create_engine",
    "driver_options",
    "resolve_database_url",
    "run_statement",
]

logger = logging.getLogger(__name__)

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


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    application_name: str = "mana-ai",
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    pgbouncer: bool = False,
    pool_timeout_s: float = 30.0,
    statement_timeout_s: float | None = 60.0,
) -> AsyncEngine:
    """An ``AsyncEngine`` on asyncpg for ``url`` (any scheme ``to_async_url`` accepts); the
    caller owns it and must ``await engine.dispose()`` at shutdown. See the module doc for the
    pool's behaviour.

    Args:
        pool_size, max_overflow: at most their sum of connections (``MANA_AI_DB_POOL_SIZE``).
        application_name: shown in ``pg_stat_activity``.
        connect_timeout_s: a server that accepts TCP but never answers fails after it.
        pgbouncer: for PgBouncer in transaction pooling mode (no prepared-statement caches,
            unique statement names).
        pool_timeout_s: a checkout that finds no free connection waits this long, then raises
            SQLAlchemy's ``TimeoutError``.
        statement_timeout_s: asyncpg's ``command_timeout`` (``None``: wait for ever); past it
            a statement raises ``TimeoutError``, a transient failure (``worker.db.transient``).
    """
    connect_args = driver_options(
        application_name=application_name,
        connect_timeout_s=connect_timeout_s,
        statement_timeout_s=statement_timeout_s,
        pgbouncer=pgbouncer,
    )
    if pgbouncer:  # SQLAlchemy's own statement cache and names, beside asyncpg's
        connect_args |= {
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": _unique_statement_name,
        }
    engine = create_async_engine(
        to_async_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout_s,
        pool_recycle=1800,
        pool_use_lifo=True,
        connect_args=connect_args,
        execution_options={PGBOUNCER_OPTION: pgbouncer},
    )
    _check_out_live_connections(engine)
    _discard_connections_of_a_gone_server(engine)
    return engine


def _discard_connections_of_a_gone_server(engine: AsyncEngine) -> None:
    """An error that says the server will not take writes any more (``server_gone``: demoted
    by a failover, shutting down, in recovery) counts as a disconnect: SQLAlchemy invalidates
    the connection and every one pooled before it (they reached the same server), and the
    error says ``connection_invalidated``. The next checkout connects afresh: with a multi-host
    URL and ``target_session_attrs=read-write``, to the new primary."""

    def on_error(context: ExceptionContext) -> None:
        if not context.is_disconnect and server_gone(context.original_exception):
            context.is_disconnect = True

    event.listen(engine.sync_engine, "handle_error", on_error)


PGBOUNCER_OPTION = "mana_ai_pgbouncer"
"""The engine's execution option that says it was created with ``pgbouncer=True``
(``behind_pgbouncer``)."""


def behind_pgbouncer(engine: AsyncEngine) -> bool:
    """Whether ``engine`` was created for PgBouncer in transaction mode (``create_engine``)."""
    return bool(engine.get_execution_options().get(PGBOUNCER_OPTION, False))


PING_AFTER_IDLE_S = 10.0
"""Seconds a pooled connection may sit unused before it is pinged when taken again."""


def _check_out_live_connections(engine: AsyncEngine) -> None:
    dialect = engine.dialect

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if dbapi_connection.driver_connection.is_closed():
            # nothing was sent on it yet: a statement that must not run twice (a claim) can
            # still run once, on the new connection the pool opens in its place
            raise DisconnectionError("the connection was closed by the server or the network")
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # the pool drops this connection and takes (or opens) another one
            raise DisconnectionError(f"idle connection is gone: {exc}") from exc

    event.listen(engine.sync_engine, "checkin", checked_in)
    event.listen(engine.sync_engine, "checkout", checked_out)


def _unique_statement_name() -> str:
    return f"__asyncpg_{uuid.uuid4().hex}__"


async def run_statement(
    engine: AsyncEngine,
    stmt: Any,
    params: dict[str, Any] | None = None,
    *,
    idempotent: bool = True,
) -> list[RowMapping]:
    """Run one statement on its own and return its rows.

    In autocommit (one round trip: a statement is atomic by itself), except behind PgBouncer
    in transaction mode (``behind_pgbouncer``), where it runs in BEGIN/COMMIT so that its
    prepare and execute are not routed to different server connections.

    A connection that breaks under it (the server ended it, the network dropped it, or a
    failover left it on a server that no longer takes writes: ``server_gone``) is thrown
    away, and an ``idempotent`` statement (the default) runs once more on another: one whose
    second run after a first that did commit is harmless (mana-ai's writes are conditional on
    the lease, or count a call twice at worst). A statement that is not (a claim: run again, it
    would claim more missions while those the first one claimed wait, unseen, for their lease
    to expire) is not run again: the break is raised, and the caller decides. Other errors,
    and a second break, are raised (SQLAlchemy's ``DBAPIError`` subclasses).
    """
    try:
        return await _run_statement_once(engine, stmt, params)
    except DBAPIError as exc:
        if not connection_broken(exc) or not idempotent:
            raise
        logger.warning(
            "database connection lost (%s); running the statement again on another",
            describe_error(exc),
        )
        return await _run_statement_once(engine, stmt, params)


async def _run_statement_once(
    engine: AsyncEngine, stmt: Any, params: dict[str, Any] | None
) -> list[RowMapping]:
    async with engine.connect() as conn:
        try:
            if not behind_pgbouncer(engine):
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                return _rows(await conn.execute(stmt, params))
            async with conn.begin():
                return _rows(await conn.execute(stmt, params))
        except DBAPIError as exc:
            if connection_broken(exc) and not conn.invalidated:
                await conn.invalidate()  # never back into the pool
            raise


def _rows(result: CursorResult[Any]) -> list[RowMapping]:
    """The rows of ``result`` (none for a statement that returns none)."""
    return list(result.mappings().all()) if result.returns_rows else []


def connection_broken(exc: DBAPIError) -> bool:
    """Whether ``exc`` says the connection is unusable rather than the statement wrong:
    SQLAlchemy's disconnect detection, asyncpg's interface errors (``connection is closed``)
    and its client state errors (``cannot switch to state …; another operation is in
    progress``, left by an operation the server cut off)."""
    return exc.connection_invalidated or isinstance(exc, InterfaceError | InternalError)


async def check_connection(engine: AsyncEngine, *, wait_s: float = 0.0) -> None:
    """Open one connection and run ``SELECT 1``; with ``wait_s`` > 0, retry a transient
    failure (``worker.db.transient``: refused, reset, DNS, the server starting up or shutting
    down, no slot free) with backoff for up to ``wait_s`` seconds, one warning line per
    failed attempt (``connecting to PostgreSQL at … failed (attempt 3: …); retrying in 2.00
    s``). A failure that is not transient (a wrong password, no such database) fails at once.

    Raises:
        DatabaseError: naming the database (without its password) and the reason, e.g.
            ``could not connect to PostgreSQL at postgresql+asyncpg://u:***@db/x:
            ConnectionRefusedError: [Errno 111] Connect call failed``.
    """

    where = redact_url(engine.url.render_as_string(hide_password=False))

    async def select_one() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    try:
        if wait_s > 0:
            await retry_transient(
                select_one,
                deadline=time.monotonic() + wait_s,
                what=f"connecting to PostgreSQL at {where}",
            )
        else:
            await select_one()
    except (SQLAlchemyError, OSError) as exc:
        detail = describe_error(exc)
        if "prepared statement" in detail and not behind_pgbouncer(engine):
            # what asyncpg's statement cache meets behind PgBouncer in transaction mode
            detail += (
                " (is this PgBouncer in transaction pooling mode? then set "
                "MANA_AI_DB_PGBOUNCER=true)"
            )
        raise DatabaseError(f"could not connect to PostgreSQL at {where}: {detail}") from exc


async def resolve_database_url(settings: Settings) -> str:
    """The asyncpg URL the daemon should use.

    ``settings.database.url`` when set; otherwise an embedded PostgreSQL under
    ``settings.database.data_dir / "pgdata"`` is started (in a thread, it blocks) and its URL
    returned. Both cases are logged, without passwords.

    Raises:
        DatabaseError: the embedded server could not be started.
    """
    if settings.database.url is not None:
        logger.info("using PostgreSQL at %s", redact_url(settings.database.url))
        return settings.database.url
    pgdata = settings.database.data_dir / "pgdata"
    logger.debug(  # the command line says so on stderr (worker.cli.stores)
        "MANA_AI_DATABASE_URL is not set: starting embedded PostgreSQL with its data in %s",
        pgdata,
    )
    from worker.db.embedded import start_embedded_postgres

    url = await asyncio.to_thread(start_embedded_postgres, pgdata)
    logger.info("embedded PostgreSQL is ready: %s (data in %s)", url, pgdata)
    return url
