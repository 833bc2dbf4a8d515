"""``mana-ai db``: the database schema."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from worker.cli.args import group

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``db upgrade``."""
    db = group(commands, "db", "Database schema.")
    upgrade = db.add_parser(
        "upgrade",
        help="Migrate the schema to the latest revision (safe with replicas: advisory lock).",
        description="Migrate the schema to the latest revision under a PostgreSQL advisory "
        "lock, so replicas starting together do not collide.",
    )
    upgrade.set_defaults(command_fn=_upgrade)


async def _upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.stores import database
    from worker.db.migrate import current_revision

    async with database(settings, migrate=True) as engine:
        print(f"database schema at revision {await current_revision(engine)}")
    return 0
