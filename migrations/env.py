"""Alembic environment for mana-ai (async, asyncpg).

Three ways in:

* Programmatic (the daemon, tests): ``worker.db.migrate.upgrade_database`` passes an open
  connection in ``config.attributes["connection"]``, already holding the migration lock;
  it is used as is and left open.
* Command line (``alembic upgrade head``): the URL is ``sqlalchemy.url`` from alembic.ini when
  set, else the daemon's own choice (``MANA_AI_DATABASE_URL``, or the embedded PostgreSQL under
  ``MANA_AI_DATA_DIR``); the run holds the same advisory lock as the daemon, in the
  migration's transaction. It keeps no statement cache, so it works through PgBouncer in
  transaction pooling mode whatever ``MANA_AI_DB_PGBOUNCER`` says (a migration runs a few
  dozen statements once; the cache would save nothing).
* Offline (``alembic upgrade head --sql``): prints the SQL instead of running it.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from worker.database_url import to_async_url
from worker.db.engine import create_engine, resolve_database_url
from worker.db.migrate import migration_lock
from worker.db.tables import metadata

config = context.config
target_metadata = metadata


def run_migrations(connection: Connection) -> None:
    """Run the pending migrations on ``connection``, in one transaction: the caller's when
    ``connection`` is in one (``migration_lock``), else alembic's own."""
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def run_standalone() -> None:
    """Command-line path: connect, take the migration lock, migrate, disconnect."""
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from worker.settings import load_settings

        url = await resolve_database_url(load_settings())
    engine = create_engine(url, pool_size=1, max_overflow=0, pgbouncer=True)
    try:
        async with engine.connect() as conn, migration_lock(conn):
            await conn.run_sync(run_migrations)
    finally:
        await engine.dispose()


def run_offline() -> None:
    """``--sql``: emit the migration SQL for PostgreSQL without connecting."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=to_async_url(url) if url else None,
        dialect_name=None if url else "postgresql",
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
elif (connection := config.attributes.get("connection")) is not None:
    run_migrations(connection)
else:
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    asyncio.run(run_standalone())
