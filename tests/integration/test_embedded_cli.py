"""Commands on the embedded PostgreSQL say which one they use: a forgotten
``MANA_AI_DATABASE_URL`` must not pass for an empty database."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_harness import command_names
from worker.cli import main
from worker.db.embedded import stop_embedded_postgres


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """One embedded cluster for the module (started by the first command, stopped after).
    Mode 0755: as root the server's own user must enter it (conftest's embedded_tempdir)."""
    path = Path(tempfile.mkdtemp(prefix="mana-ai-cli-"))
    path.chmod(0o755)
    yield path
    stop_embedded_postgres(path / "pgdata")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def run(data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    monkeypatch.delenv("MANA_AI_DATABASE_URL", raising=False)  # forgotten
    monkeypatch.setenv("MANA_AI_DATA_DIR", str(data_dir))
    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://127.0.0.1:9/v1")

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def notice(data_dir: Path) -> str:
    return (
        "mana-ai: MANA_AI_DATABASE_URL is not set: using the embedded PostgreSQL in "
        f"{data_dir / 'pgdata'}\n"
    )


def test_an_empty_list_and_a_missing_mission_name_the_embedded_database(
    run: Any, data_dir: Path
) -> None:
    # the trial: "missions list" printed "(none)", "missions show 11" said "not found"
    assert run("missions", "list") == (0, "(none)\n", notice(data_dir))
    code, out, err = run("missions", "show", "11")
    assert (code, out) == (1, "")
    assert err == notice(data_dir) + "mana-ai: error: no mission with id 11\n"


def test_json_output_stays_clean_on_stdout(run: Any, data_dir: Path) -> None:
    code, out, err = run("agents", "add", "--name", "embedded", "--owner", "u", "--json")
    assert code == 0 and json.loads(out)["name"] == "embedded"
    assert err == notice(data_dir)
    code, out, err = run("policy", "show", "u", "--json")
    assert code == 0 and json.loads(out)["owns_agents"] is True and err == notice(data_dir)


def test_a_configured_database_is_not_announced(
    run: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    code, _, err = run("agents", "list")
    assert code == 0 and err == ""


@pytest.mark.parametrize("explicit", [False, True])
def test_root_is_told_of_a_database_left_in_the_old_default(
    explicit: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # as root the default data directory moved to /var/lib/mana-ai: a database in the old
    # default is pointed out, unless MANA_AI_DATA_DIR chose a directory
    from worker.cli.stores import announce_database
    from worker.settings import load_settings

    if os.geteuid() != 0:
        pytest.skip("the default data directory moved for root only")
    for name in ("MANA_AI_DATABASE_URL", "MANA_AI_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    if explicit:
        monkeypatch.setenv("MANA_AI_DATA_DIR", str(tmp_path / "chosen"))
    monkeypatch.setenv("HOME", str(tmp_path))
    old = tmp_path / ".local" / "share" / "mana-ai"
    (old / "pgdata").mkdir(parents=True)
    (old / "pgdata" / "PG_VERSION").write_text("18\n")
    settings = load_settings()
    announce_database(settings)  # prints only; opens nothing
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith(
        f"using the embedded PostgreSQL in {settings.database.data_dir}/pgdata"
    )
    hint = (
        f"mana-ai: note: an embedded database from an earlier version is in {old}/pgdata; "
        f"set MANA_AI_DATA_DIR={old} to use it"
    )
    assert lines[1:] == ([] if explicit else [hint])


def test_a_database_left_in_the_old_default_is_pointed_out_when_xdg_data_home_moved_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the default follows $XDG_DATA_HOME now; before, it was ~/.local/share/mana-ai always
    from worker.cli.stores import announce_database
    from worker.settings import load_settings

    for name in ("MANA_AI_DATABASE_URL", "MANA_AI_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    old = tmp_path / ".local" / "share" / "mana-ai"
    (old / "pgdata").mkdir(parents=True)
    (old / "pgdata" / "PG_VERSION").write_text("18\n")
    settings = load_settings()
    expected = Path("/var/lib/mana-ai") if os.geteuid() == 0 else tmp_path / "xdg" / "mana-ai"
    assert settings.database.data_dir == expected
    announce_database(settings)  # prints only; opens nothing
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"mana-ai: MANA_AI_DATABASE_URL is not set: using the embedded PostgreSQL in "
        f"{expected}/pgdata",
        f"mana-ai: note: an embedded database from an earlier version is in {old}/pgdata; "
        f"set MANA_AI_DATA_DIR={old} to use it",
    ]


IN_PROCESS = {
    "db upgrade": ["db", "upgrade"],
    "agents add": ["agents", "add", "--name", "told", "--owner", "u"],
    "agents set": ["agents", "set", "told", "--max-rounds", "3"],
    "agents list": ["agents", "list"],
    "missions add": ["missions", "add", "--agent", "told", "--objective", "x", "--due-now"],
    "missions list": ["missions", "list"],
    "missions show": ["missions", "show", "1"],
    "missions history": ["missions", "history", "1"],
    "missions pause": ["missions", "pause", "1"],
    "missions resume": ["missions", "resume", "1"],
    "tick": ["tick"],
    "iterations list": ["iterations", "list"],
    "iterations show": ["iterations", "show", "latest"],
    "replay": ["replay", "latest"],
    "policy show": ["policy", "show", "u"],
    "policy allow-destructive": ["policy", "allow-destructive", "u", "notes_delete"],
    "policy revoke-destructive": ["policy", "revoke-destructive", "u", "notes_delete"],
    "policy set-rate-limit": ["policy", "set-rate-limit", "u", "5"],
    "policy report": ["policy", "report"],
    "mcp token create": ["mcp", "token", "create", "u"],
    "mcp token list": ["mcp", "token", "list"],
    "mcp token revoke": ["mcp", "token", "revoke", "1"],
    "approvals list": ["approvals", "list"],
    "approvals show": ["approvals", "show", "1"],
    "approvals approve": ["approvals", "approve", "1"],
    "approvals deny": ["approvals", "deny", "1"],
    "admin token create": ["admin", "token", "create", "alice"],
    "admin token list": ["admin", "token", "list"],
    "admin token revoke": ["admin", "token", "revoke", "1"],
}  # fmt: skip
"""A command line of every command that runs to its end: each opens the database."""

SERVERS = {
    "worker": (["worker"], "ticking every"),
    "mcp serve": (["mcp", "serve"], "mana-ai: serving MCP at"),
    "serve": (["serve"], "mana-ai: serving the API at"),
}
"""The commands that run until stopped, with the line that says they are up."""


def test_every_command_is_here_once() -> None:
    assert sorted(command_names()) == sorted([*IN_PROCESS, *SERVERS])


@pytest.mark.parametrize("command", IN_PROCESS)
def test_every_command_names_the_embedded_database_it_opens(
    command: str, run: Any, data_dir: Path
) -> None:
    # the trial: `mcp serve` (and `mcp token …`) opened it without a word; a missing row
    # (exit 1) is fine here, what is printed before it is the point
    code, _, err = run(*IN_PROCESS[command])
    assert code in (0, 1) and err.startswith(notice(data_dir)), err
    assert err.count("MANA_AI_DATABASE_URL is not set") == 1


@pytest.mark.parametrize("command", SERVERS)
def test_the_servers_name_the_embedded_database_before_they_serve(
    command: str, data_dir: Path
) -> None:
    argv, ready = SERVERS[command]
    env = {k: v for k, v in os.environ.items() if k != "MANA_AI_DATABASE_URL"}
    env |= {"MANA_AI_DATA_DIR": str(data_dir), "MANA_AI_METRICS_PORT": "0", "MANA_AI_MCP_PORT": "0"}
    env |= {"MANA_AI_API_PORT": "0"}
    env |= {"MANA_AI_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # until the server says it is up (or exits)
            lines.append(line)
            if ready in line:
                break
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=60)[1]
    assert any(ready in line for line in lines), "".join(lines) + rest
    assert lines[0] == notice(data_dir) and proc.returncode == 0
