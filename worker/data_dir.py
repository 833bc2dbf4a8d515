"""The data directory: where mana-ai keeps its local state (the embedded PostgreSQL cluster)
unless ``MANA_AI_DATA_DIR`` says otherwise, as the platform's conventions place it."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["APP_NAME", "ROOT_DATA_DIR", "USER_DATA_DIR", "default_data_dir"]

APP_NAME = "mana-ai"
USER_DATA_DIR = "~/.local/share/mana-ai"
"""The default data directory before it followed ``$XDG_DATA_HOME`` (and, as root, before
``ROOT_DATA_DIR``): an embedded database may still be there (``worker.cli.stores``)."""
ROOT_DATA_DIR = "/var/lib/mana-ai"


def default_data_dir(*, root: bool | None = None) -> Path:
    """The platform's data directory for ``mana-ai``: platformdirs' ``user_data_dir``, i.e.
    ``$XDG_DATA_HOME/mana-ai`` (an absolute ``$XDG_DATA_HOME``, as the XDG Base Directory
    Specification says), else ``~/.local/share/mana-ai`` (on macOS ``~/Library/Application
    Support/mana-ai``). As root (``root=None``: when this process runs as root)
    ``ROOT_DATA_DIR``, which the embedded PostgreSQL's system user reaches without any
    directory above it changing its permissions (``worker.db.embedded_root``): a home such as
    ``/root`` is ``0700``, and mana-ai never changes a directory it did not create."""
    if root is None:
        root = os.name == "posix" and os.geteuid() == 0
    if root:
        return Path(ROOT_DATA_DIR)
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
