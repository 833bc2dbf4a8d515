"""Bring a database to the newest schema (alembic ``upgrade head``), safely from many replicas.

Replicas that start together would otherwise race to create the same tables. Every migration
run therefore holds a PostgreSQL session-level advisory lock, ``MIGRATION_LOCK_KEY``, on the
connection that runs the migration: the first replica migrates, the others wait on the lock
and then find the database at head (a no-op). ``alembic upgrade head`` from the command line
(``migrations/env.py``) takes the same lock.

The migration scripts are located through the ``migrations`` package, not the current
directory, so this works from an installed wheel as well as from a checkout.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import migrations
from worker.db.engine import describe_error, redact_url
from worker.errors import DatabaseError

__all__ = [
    "MIGRATION_LOCK_KEY",
    "alembic_config",
    "current_revision",
    "head_revision",
    "migration_lock",
    "upgrade_database",
]

logger = logging.getLogger(__name__)

MIGRATION_LOCK_KEY = 0x6D616E615F616931
"""The ``pg_advisory_lock`` key of migration runs: the ASCII bytes of ``"mana_ai1"`` read as a
big-endian signed 64-bit integer (7885351518267664689). Advisory locks are per database, so
unrelated databases on one server don't contend; don't reuse this key for anything else."""


def alembic_config() -> Config:
    """An alembic ``Config`` for mana-ai's migrations, with no ini file and no URL."""
    config = Config()
    script_location = str(_script_location())
    # ConfigParser interpolation: a literal '%' in a path must be doubled.
    config.set_main_option("script_location", script_location.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest revision this version of mana-ai knows (``0001`` …)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


@asynccontextmanager
async def migration_lock(conn: AsyncConnection) -> AsyncIterator[None]:
    """Hold the migration advisory lock on ``conn`` for the duration of the block.

    Waits (without a timeout) while another session holds it. The lock belongs to the session,
    not the transaction: it is taken and committed first, so the block may commit and begin
    transactions freely. On exit the block's open transaction is rolled back, then the lock is
    released; if releasing fails the connection is invalidated (closing it releases the lock)
    rather than returned to the pool holding the lock.
    """
    await conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    await conn.commit()
    try:
        yield
    finally:
        try:
            await conn.rollback()
            await conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
            await conn.commit()
        except Exception:
            logger.warning("could not release the migration lock; closing the connection")
            await conn.invalidate()
            raise


def _script_location() -> Path:
    # ``__path__`` rather than ``__file__``: the package may be imported as a namespace
    # package (e.g. by an editable install made before it had an ``__init__.py``).
    for entry in migrations.__path__:
        if (Path(entry) / "env.py").is_file():
            return Path(entry).resolve()
    raise DatabaseError(
        f"no alembic env.py in the migrations package ({list(migrations.__path__)})"
    )


async def upgrade_database(engine: AsyncEngine) -> str:
    """Migrate the database behind ``engine`` to head and return the head revision.

    Idempotent: at head already, it only takes and releases the lock. Concurrent callers (in
    this process or other replicas) are serialised by ``MIGRATION_LOCK_KEY``; the whole upgrade
    runs in one transaction (PostgreSQL has transactional DDL), so a failure leaves the schema
    as it was.

    Not for concurrent use in one process against *different* databases: alembic keeps the
    running migration context in module globals.

    Raises:
        DatabaseError: the database could not be reached, or a migration failed, or the
            database is at a revision this version of mana-ai does not know (a newer release
            migrated it). The message names the database without its password.
    """
    where = redact_url(engine.url.render_as_string(hide_password=False))
    try:
        async with engine.connect() as conn, migration_lock(conn):
            revision = await conn.run_sync(_upgrade_to_head)
    except CommandError as exc:
        raise DatabaseError(f"could not migrate {where}: {exc}") from exc
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseError(f"could not migrate {where}: {describe_error(exc)}") from exc
    logger.info("database %s is at schema revision %s", where, revision)
    return revision


async def current_revision(engine: AsyncEngine) -> str | None:
    """The schema revision the database is at, or ``None`` when it was never migrated."""
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


def _upgrade_to_head(connection: Connection) -> str:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
    revision = _current(connection)
    assert revision is not None
    return revision


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
