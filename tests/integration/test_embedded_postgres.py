"""The embedded PostgreSQL of the no-configuration default, across client processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

START = (
    "import os, signal, sys; from pathlib import Path; "
    "from worker.db.embedded import start_embedded_postgres; "
    "start_embedded_postgres(Path(sys.argv[1])); "
    "os.kill(os.getpid(), signal.SIGKILL) if sys.argv[2] == 'crash' else None"
)


def client(pgdata: Path, mode: str) -> int:
    """Run a process that starts (or reuses) the server, then exits or is SIGKILLed."""
    result = subprocess.run(
        [sys.executable, "-c", START, str(pgdata), mode], capture_output=True, timeout=120
    )
    return result.returncode


def server_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    if not pidfile.exists():
        return None
    pid = int(pidfile.read_text().split()[0])
    return pid if psutil.pid_exists(pid) else None


@pytest.fixture
def pgdata(embedded_dir: Path) -> Iterator[Path]:
    yield embedded_dir / "pgdata"
    pid = server_pid(embedded_dir / "pgdata")
    if pid is not None:
        psutil.Process(pid).terminate()
        psutil.Process(pid).wait(10)


def test_a_crashed_client_does_not_keep_the_server_running_forever(pgdata: Path) -> None:
    assert client(pgdata, "crash") == -9
    crashed_with = server_pid(pgdata)
    assert crashed_with is not None, "a SIGKILLed client leaves the server running"

    assert client(pgdata, "exit") == 0
    # the next clean client reused the server, forgot the dead client, and stopped it at exit
    assert server_pid(pgdata) is None
    assert os.path.exists(pgdata / "PG_VERSION")


@pytest.mark.parametrize(
    ("data_dir", "error"),
    [
        ("/proc/nope", "No such file or directory"),  # the trial's: /proc takes no directory
        ("/proc/nope/deeper", "No such file or directory (/proc/nope)"),
        ("{file}", "Not a directory"),
        ("{file}/sub", "Not a directory"),
    ],
)
def test_a_data_directory_that_cannot_be_made_is_named_without_a_log_that_is_not_there(
    data_dir: str,
    error: str,
    embedded_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    from worker.cli import main

    (embedded_dir / "a-file").write_text("")
    where = Path(data_dir.format(file=embedded_dir / "a-file"))
    monkeypatch.delenv("MANA_AI_DATABASE_URL", raising=False)
    monkeypatch.setenv("MANA_AI_DATA_DIR", str(where))
    assert main(["agents", "list"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(
        f"mana-ai: error: cannot create or write the data directory {where} of the embedded "
        f"PostgreSQL: {error}"
    ), err
    assert err.endswith("set MANA_AI_DATA_DIR to a directory mana-ai may create and write")
    assert "log" not in err  # said "see the server log at /proc/nope/pgdata/log"


HOLD = (
    "import ctypes, sys; from pathlib import Path; "
    # 36: PR_SET_CHILD_SUBREAPER
    "sys.argv[2] == 'subreaper' and ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
    "from worker.db.embedded import start_embedded_postgres; "
    "start_embedded_postgres(Path(sys.argv[1])); print('up', flush=True); sys.stdin.readline()"
)


def mana_ai(data_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MANA_AI_DATABASE_URL"}
    env["MANA_AI_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def kill_server(pgdata: Path) -> psutil.Process:
    pid = server_pid(pgdata)
    assert pid is not None
    server = psutil.Process(pid)
    server.kill()  # SIGKILL
    return server


@contextmanager
def holder(pgdata: Path, mode: str) -> Iterator[subprocess.Popen[str]]:
    """A client process that starts (or reuses) the server and holds it until its stdin
    closes; with ``subreaper`` it also becomes the server's parent, and never reaps it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(pgdata), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        yield proc
    finally:
        if proc.poll() is None:  # the test failed before it let go
            proc.kill()
            proc.communicate()


def test_a_killed_server_leaves_no_traceback_and_the_next_command_starts_another(
    pgdata: Path,
) -> None:
    with holder(pgdata, "plain") as held:
        kill_server(pgdata)
        # at once, while the dead server may still be a zombie that looks alive
        after = mana_ai(pgdata.parent, "agents", "list")
        assert (after.returncode, after.stdout) == (0, "(none)\n"), after.stderr
        _, err = held.communicate("\n", timeout=120)
    assert held.returncode == 0 and "Traceback" not in err, err
    # the holder was the last client of the server the command started: it stopped it
    assert server_pid(pgdata) is None


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_a_killed_server_nobody_reaps_is_named_and_its_clients_exit_cleanly(
    pgdata: Path,
) -> None:
    # the holder is the server's parent and never reaps it: the dead server stays a zombie,
    # whose postmaster.pid looks alive (the package reused it: "Connection refused")
    with holder(pgdata, "subreaper") as held:
        server = kill_server(pgdata)
        until(lambda: server.status() == psutil.STATUS_ZOMBIE, "the killed server's zombie")
        after = mana_ai(pgdata.parent, "agents", "list")
        assert after.returncode == 1 and "Traceback" not in after.stderr
        assert (
            f"the embedded PostgreSQL server in {pgdata} was killed: its process {server.pid} "
            f"has exited, but its parent (process {held.pid}) has not reaped it"
        ) in " ".join(after.stderr.split())
        # its client exits at once and quietly: no traceback, no `pg_ctl stop` of a dead one
        _, err = held.communicate("\n", timeout=120)
    assert (held.returncode, err) == (0, "")
    again = mana_ai(pgdata.parent, "agents", "list")
    assert (again.returncode, again.stdout) == (0, "(none)\n"), again.stderr


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("with space", "U+0020 SPACE"),  # the tester's: postgres: invalid argument: "space/…"
        ("a,b", "U+002C COMMA"),  # PostgreSQL would read two socket directories
        ("a;b", "U+003B SEMICOLON"),  # the shell would read two commands
        ("it's", "U+0027 APOSTROPHE"),
    ],
)
def test_a_data_directory_the_embedded_server_cannot_use_is_refused_before_anything_is_made(
    name: str,
    named: str,
    embedded_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    from worker.cli import main
    from worker.db.embedded import start_embedded_postgres
    from worker.errors import SettingsError

    data_dir = embedded_dir / name / "d"
    with pytest.raises(SettingsError) as caught:
        start_embedded_postgres(data_dir / "pgdata")
    message = str(caught.value)
    assert message.startswith(
        f"MANA_AI_DATA_DIR: the embedded PostgreSQL cannot run in {data_dir}/pgdata: its path "
        f"holds {named}"
    ), message
    assert message.endswith("or set MANA_AI_DATABASE_URL to a PostgreSQL server")
    assert not (embedded_dir / name).exists()  # nothing made, no server tried

    monkeypatch.delenv("MANA_AI_DATABASE_URL", raising=False)
    monkeypatch.setenv("MANA_AI_DATA_DIR", str(data_dir))
    assert main(["agents", "list"]) == 2  # was 1, with a CalledProcessError's long text
    err = capsys.readouterr().err
    assert "mana-ai: invalid settings: MANA_AI_DATA_DIR: the embedded PostgreSQL" in err
    assert "CalledProcessError" not in err and "Traceback" not in err


def test_a_data_directory_with_the_other_characters_a_path_may_hold_works(
    embedded_dir: Path,
) -> None:
    from worker.db.embedded import start_embedded_postgres, stop_embedded_postgres

    pgdata = embedded_dir / "données-1.2+x@y=z:w%v~u_t" / "pgdata"
    url = start_embedded_postgres(pgdata, cleanup_mode="stop")
    try:
        assert url.startswith("postgresql+asyncpg://postgres@/mana_ai?host=")
        asyncio.run(_select_one(url))  # the URL reaches the server through that path
    finally:
        stop_embedded_postgres(pgdata)
    assert server_pid(pgdata) is None


async def _select_one(url: str) -> None:
    from worker.db.engine import check_connection, create_engine

    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        await check_connection(engine)
    finally:
        await engine.dispose()
