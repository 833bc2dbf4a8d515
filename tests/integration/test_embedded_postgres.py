"""The embedded PostgreSQL of the no-configuration default, across client processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
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
