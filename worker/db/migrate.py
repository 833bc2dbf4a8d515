"""Bring a database to the newest schema (alembic ``upgrade head``), safely from many replicas.

Replicas that start together would otherwise race to create the same tables. Every migration
run therefore holds a PostgreSQL advisory lock, ``MIGRATION_LOCK_KEY``: the first replica
migrates, the others wait on the lock and then find the database at head (a no-op).
``alembic upgrade head`` from the command line (``migrations/env.py``) takes the same lock.

The lock is transaction-level (``pg_advisory_xact_lock``), taken in the one transaction that
runs the whole upgrade (PostgreSQL has transactional DDL) and released by its commit or
rollback. No session state is left behind, so migrating through PgBouncer in transaction
pooling mode works (a session lock would be taken on one server connection and released, or
never, on another), and a crashed migration can never leave the lock held.

The migration scripts are located through the ``migrations`` package (found, not imported:
its ``env.py`` imports this layer, which never imports it back), not the current directory,
so this works from an installed wheel as well as from a checkout.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, text
from sqlalchemy.exc import ProgrammingError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker.database_url import redact_url
from worker.db.revision import HEAD_REVISION, REVISION_QUERY, revision_problem
from worker.db.transient import describe_error, retry_transient, sqlstate_of
from worker.errors import DatabaseError

if TYPE_CHECKING:  # alembic is loaded only to migrate: a command that checks does without it
    from alembic.config import Config

__all__ = [
    "HEAD_REVISION",
    "MIGRATION_LOCK_KEY",
    "alembic_config",
    "current_revision",
    "head_revision",
    "migration_lock",
    "upgrade_database",
]

logger = logging.getLogger(__name__)

MIGRATION_LOCK_KEY = 0x6D616E615F616931
"""The ``pg_advisory_xact_lock`` key of migration runs: the ASCII bytes of ``"mana_ai1"`` read as a
big-endian signed 64-bit integer (7885351518267664689). Advisory locks are per database, so
unrelated databases on one server don't contend; don't reuse this key for anything else."""


def alembic_config() -> Config:
    """An alembic ``Config`` for mana-ai's migrations, with no ini file and no URL."""
    from alembic.config import Config

    config = Config()
    script_location = str(_script_location())
    # ConfigParser interpolation: a literal '%' in a path must be doubled.
    config.set_main_option("script_location", script_location.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest revision this version of mana-ai knows (``0001`` …), as alembic reads it
    from the scripts (``HEAD_REVISION`` is the same, known without reading them)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


@asynccontextmanager
async def migration_lock(conn: AsyncConnection) -> AsyncIterator[None]:
    """Run the block in one transaction on ``conn`` that holds the migration advisory lock.

    Begins a transaction (``conn`` must not be in one: ``InvalidRequestError`` otherwise),
    takes ``pg_advisory_xact_lock(MIGRATION_LOCK_KEY)`` — waiting, without a timeout, while
    another transaction holds it — and runs the block in that transaction. The transaction
    commits when the block exits normally and rolls back when it raises; either way the lock
    ends with it. Whatever the block runs on ``conn`` (alembic included: it finds the
    transaction open and uses it) is therefore under the lock and atomic with the migration.
    """
    async with conn.begin():
        await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        yield


def _script_location() -> Path:
    # its search locations rather than its file: the package may be found as a namespace
    # package (e.g. by an editable install made before it had an ``__init__.py``).
    spec = importlib.util.find_spec("migrations")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for entry in locations:
        if (Path(entry) / "env.py").is_file():
            return Path(entry).resolve()
    raise DatabaseError(f"no alembic env.py in the migrations package ({locations})")


async def upgrade_database(engine: AsyncEngine, *, wait_s: float = 0.0) -> str:
    """Migrate the database behind ``engine`` to head and return the head revision.

    Idempotent: at head already, it only reads the revision (one statement; neither the lock
    nor alembic). Concurrent callers (in
    this process or other replicas) are serialised by ``MIGRATION_LOCK_KEY``; the lock, the
    whole upgrade and the read of the resulting revision are one transaction (PostgreSQL has
    transactional DDL), so a failure leaves the schema as it was. Works through PgBouncer in
    transaction pooling mode (no session state; see the module docstring).

    With ``wait_s`` > 0 the read of the revision and the upgrade's transaction are each tried
    again after a transient failure (``worker.db.transient.retry_transient``) until
    ``wait_s`` seconds after the call: a transaction whose connection broke was rolled back,
    and one whose commit's answer was lost is found at head by the next attempt.

    Not for concurrent use in one process against *different* databases: alembic keeps the
    running migration context in module globals.

    Raises:
        DatabaseError: the database could not be reached, or a migration failed, or the
            database is at a revision this version of mana-ai does not know (a newer release
            migrated it). The message names the database without its password.
    """
    where = redact_url(engine.url.render_as_string(hide_password=False))
    deadline = time.monotonic() + wait_s
    try:
        current = await retry_transient(
            lambda: current_revision(engine),
            deadline=deadline,
            what=f"reading the schema revision of {where}",
        )
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseError(f"could not migrate {where}: {describe_error(exc)}") from exc
    if current == HEAD_REVISION:  # the usual start of a replica: one statement, no lock, no alembic
        logger.info("database %s is at schema revision %s", where, HEAD_REVISION)
        return HEAD_REVISION
    if current is not None and current > HEAD_REVISION:  # alembic would not find it
        raise DatabaseError(f"could not migrate {where}: {revision_problem(current)}")
    from alembic.util import CommandError

    async def upgrade() -> str:
        async with engine.connect() as conn, migration_lock(conn):
            return await conn.run_sync(_upgrade_to_head)

    try:
        revision = await retry_transient(upgrade, deadline=deadline, what=f"migrating {where}")
    except CommandError as exc:
        raise DatabaseError(f"could not migrate {where}: {exc}") from exc
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseError(f"could not migrate {where}: {describe_error(exc)}") from exc
    logger.info("database %s is at schema revision %s", where, revision)
    return revision


async def current_revision(engine: AsyncEngine) -> str | None:
    """The schema revision the database is at, or ``None`` when it was never migrated: the
    row of alembic's ``alembic_version`` table, read in one statement (what alembic's
    ``MigrationContext.get_current_revision`` reads, for mana-ai's single line of revisions).
    """
    async with engine.connect() as conn:
        try:
            row = (await conn.execute(text(REVISION_QUERY))).first()
        except ProgrammingError as exc:  # no such table: never migrated
            if sqlstate_of(exc) != _UNDEFINED_TABLE:
                raise
            return None
    return None if row is None else str(row[0])


_UNDEFINED_TABLE = "42P01"


def _upgrade_to_head(connection: Connection) -> str:
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
    revision = MigrationContext.configure(connection).get_current_revision()
    assert revision is not None
    return revision
