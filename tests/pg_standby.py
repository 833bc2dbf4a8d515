"""A PostgreSQL primary with a streaming, synchronous standby of the test's own, and a
switchover between them (issue 36's failover test).

``start_pair()`` runs Debian's PostgreSQL binaries (``/usr/lib/postgresql/<major>/bin``):
``initdb`` a primary in a temporary directory, start it on a free port of 127.0.0.1 (its
socket in that directory), ``pg_basebackup -R`` a standby from it and start that on another
free port. The primary is started with ``synchronous_standby_names='*'`` on its command line
(not in its files, which the standby copies: a promoted standby waiting for a standby of its own
would never commit), so a commit it acknowledged is on the standby too, and a switchover loses
nothing. ``PrimaryAndStandby.switch_over()`` stops the primary (``fast``: connections are ended,
the standby receives everything) and promotes the standby.

PostgreSQL refuses to run as root: run as root, every command runs as the ``postgres`` system
user (``runuser``), which owns the directory.
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

__all__ = ["PrimaryAndStandby", "StandbyUnavailable", "postgres_bin_dir", "start_pair"]

SYSTEM_USER = "postgres"


class StandbyUnavailable(Exception):
    """A primary and standby cannot run here (no binaries, no ``postgres`` user); the message
    says why, for a test skip."""


def postgres_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<major>/bin`` with ``initdb``, ``pg_ctl`` and
    ``pg_basebackup``.

    Raises:
        StandbyUnavailable: none is installed, or run as root there is no ``postgres`` user
            or no ``runuser``.
    """
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    usable = [
        d
        for d in found
        if all(os.access(d / name, os.X_OK) for name in ("initdb", "pg_ctl", "pg_basebackup"))
    ]
    if not usable:
        raise StandbyUnavailable(
            "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin "
            "(apt-get install postgresql)"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise StandbyUnavailable(f"run as root and no {SYSTEM_USER!r} user") from None
        if shutil.which("runuser") is None:
            raise StandbyUnavailable("run as root and no runuser to run PostgreSQL as postgres")
    return usable[-1]


@dataclass
class PrimaryAndStandby:
    """Two running servers: ``primary_port`` and ``standby_port`` on 127.0.0.1 (user
    ``postgres``, trust), data and logs under ``workdir``."""

    bin_dir: Path
    workdir: Path
    primary_port: int
    standby_port: int

    def url(self, database: str, *, query: str = "target_session_attrs=read-write") -> str:
        """A multi-host URL of ``database`` listing the primary, then the standby."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
            f"/{database}?{query}"
        )

    def switch_over(self, pause_s: float = 0.0, *, mode: str = "fast") -> None:
        """Stop the primary, wait ``pause_s`` seconds (a failover manager noticing), then
        promote the standby and wait until it accepts writes.

        ``mode`` is ``pg_ctl stop``'s: ``fast`` (a switchover: sessions are ended, the last
        WAL reaches the standby) or ``immediate`` (a crash: the server quits at once; with
        synchronous replication what it acknowledged is on the standby already)."""
        self._pg_ctl("stop", "primary", "-m", mode)
        time.sleep(pause_s)
        self._pg_ctl("promote", "standby")

    def stop(self) -> None:
        """Stop both servers (``immediate``) and delete ``workdir``."""
        for name in ("primary", "standby"):
            if (self.workdir / name / "postmaster.pid").exists():
                self._pg_ctl("stop", name, "-m", "immediate", check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        """Both servers' logs, for a failing test's message."""
        return "\n".join(
            f"--- {name}.log\n{(self.workdir / f'{name}.log').read_text(errors='replace')}"
            for name in ("primary", "standby")
            if (self.workdir / f"{name}.log").exists()
        )

    def _pg_ctl(self, action: str, name: str, *args: str, check: bool = True) -> None:
        _run(self.bin_dir / "pg_ctl", action, "-D", self.workdir / name, "-w", *args, check=check)

    def _start(self, name: str, port: int, *settings: str) -> None:
        options = [f"-p {port}", f"-k {self.workdir}", "-c listen_addresses=127.0.0.1"]
        options += ["-c fsync=off", *(f"-c {s}" for s in settings)]
        self._pg_ctl(
            "start", name, "-l", str(self.workdir / f"{name}.log"), "-o", " ".join(options)
        )


def start_pair(timeout_s: float = 30.0) -> PrimaryAndStandby:
    """Start a primary and its synchronous standby (see the module doc); ``stop()`` it.

    Raises:
        StandbyUnavailable: see ``postgres_bin_dir``.
        subprocess.CalledProcessError: a command failed (its output in the exception).
        TimeoutError: the standby was not streaming synchronously within ``timeout_s``.
    """
    bin_dir = postgres_bin_dir()
    workdir = Path(tempfile.mkdtemp(prefix="mana-ai-standby-"))
    workdir.chmod(0o755)
    if os.geteuid() == 0:
        user = pwd.getpwnam(SYSTEM_USER)
        os.chown(workdir, user.pw_uid, user.pw_gid)
    pair = PrimaryAndStandby(bin_dir, workdir, _free_port(), _free_port())
    try:
        _run(
            bin_dir / "initdb", "-D", workdir / "primary", "-U", "postgres", "-A", "trust",
            "--no-sync",
        )  # fmt: skip
        pair._start("primary", pair.primary_port, "synchronous_standby_names='*'")
        _run(
            bin_dir / "pg_basebackup", "-h", "127.0.0.1", "-p", str(pair.primary_port),
            "-U", "postgres", "-D", workdir / "standby", "-R", "-X", "stream", "-c", "fast",
            "--no-sync",
        )  # fmt: skip
        pair._start("standby", pair.standby_port)
        _wait_for_sync_standby(pair, timeout_s)
    except BaseException:
        pair.stop()
        raise
    return pair


def _wait_for_sync_standby(pair: PrimaryAndStandby, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
    while time.monotonic() < deadline:
        out = _run(
            pair.bin_dir / "psql", "-h", "127.0.0.1", "-p", str(pair.primary_port),
            "-U", "postgres", "-d", "postgres", "-Atc", query,
        )  # fmt: skip
        if out.strip() == "1":
            return
        time.sleep(0.1)
    raise TimeoutError(f"the standby is not streaming synchronously\n{pair.logs()}")


def _run(*command: str | Path, check: bool = True) -> str:
    args = [str(part) for part in command]
    if os.geteuid() == 0:
        args = ["runuser", "-u", SYSTEM_USER, "--", *args]
    done = subprocess.run(args, capture_output=True, text=True, check=False, cwd="/")
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, args, output=done.stdout, stderr=done.stderr
        )
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
