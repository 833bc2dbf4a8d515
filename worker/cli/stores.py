"""Opening the database for one admin command."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from worker.settings import Settings, default_data_dir

if TYPE_CHECKING:  # imported when a command runs, so that `--help` stays quick
    from worker.db.admin import AdminStore
    from worker.db.policy import PolicyStore

__all__ = ["admin_store", "announce_database", "policy_store"]


def announce_database(settings: Settings) -> None:
    """With no ``MANA_AI_DATABASE_URL``, say on stderr which embedded database the command
    uses, in one line, so that a forgotten variable does not silently show an empty database.
    Call it right before the database is opened; stdout (``--json``) stays clean.

    Run as root with the default data directory, it also points at an embedded database left
    in the old default (``~/.local/share/mana-ai``), should one exist.
    """
    if settings.database_url is not None:
        return
    pgdata = settings.data_dir / "pgdata"
    print(
        f"mana-ai: MANA_AI_DATABASE_URL is not set: using the embedded PostgreSQL in {pgdata}",
        file=sys.stderr,
    )
    old = default_data_dir(root=False)
    if "data_dir" not in settings.model_fields_set and old != settings.data_dir:
        if (old / "pgdata" / "PG_VERSION").exists():
            print(
                f"mana-ai: note: an embedded database from an earlier version is in "
                f"{old / 'pgdata'}; set MANA_AI_DATA_DIR={old} to use it",
                file=sys.stderr,
            )


@asynccontextmanager
async def admin_store(settings: Settings) -> AsyncIterator[AdminStore]:
    """An ``AdminStore`` on the configured (or embedded) database, closed on exit."""
    from worker.app import open_database
    from worker.db.admin import AdminStore

    announce_database(settings)
    async with open_database(settings) as engine:
        yield AdminStore(engine)


@asynccontextmanager
async def policy_store(settings: Settings) -> AsyncIterator[PolicyStore]:
    """A ``PolicyStore`` on the configured (or embedded) database, closed on exit."""
    from worker.app import open_database
    from worker.db.policy import PolicyStore

    announce_database(settings)
    async with open_database(settings) as engine:
        yield PolicyStore(engine)
