"""Opening the database for one admin command."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from worker.settings import Settings

if TYPE_CHECKING:  # imported when a command runs, so that `--help` stays quick
    from worker.db.admin import AdminStore
    from worker.db.policy import PolicyStore

__all__ = ["admin_store", "policy_store"]


@asynccontextmanager
async def admin_store(settings: Settings) -> AsyncIterator[AdminStore]:
    """An ``AdminStore`` on the configured (or embedded) database, closed on exit."""
    from worker.app import open_database
    from worker.db.admin import AdminStore

    async with open_database(settings) as engine:
        yield AdminStore(engine)


@asynccontextmanager
async def policy_store(settings: Settings) -> AsyncIterator[PolicyStore]:
    """A ``PolicyStore`` on the configured (or embedded) database, closed on exit."""
    from worker.app import open_database
    from worker.db.policy import PolicyStore

    async with open_database(settings) as engine:
        yield PolicyStore(engine)
