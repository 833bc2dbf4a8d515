"""Shared fixtures.

Database (integration and e2e tests):

* ``postgres_admin_url`` (session): a server to create test databases on. With
  ``MANA_AI_TEST_DATABASE_URL`` set (CI: ``postgresql://postgres@127.0.0.1:5432/test``) it is
  that server; otherwise an embedded PostgreSQL in a temporary directory, deleted at the end.
* ``database_url`` (session, ``str``, asyncpg URL): a fresh, uniquely named, migrated database
  on that server, dropped at the end of the session.
* ``engine`` (session): an ``AsyncEngine`` on it, disposed at the end.
* ``db`` (function): the same engine after emptying every table (identities restarted); at
  teardown it checks that the test left no connection checked out.
* ``empty_database_url`` (function): another fresh database, never migrated, dropped after the
  test (for migration tests).

PgBouncer (``tests/pgbouncer.py``):

* ``pgbouncer`` (session): a real PgBouncer in transaction pooling mode on a free port in front
  of that server (3 server connections per database); ``pgbouncer.url_for(url)`` is ``url``
  through it. Tests using it skip when PgBouncer is not installed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from planner.testing import ScriptedChatModel
from tests.pgbouncer import PgBouncer, PgBouncerUnavailable, start_pgbouncer
from worker import redaction
from worker.database_url import to_async_url
from worker.db.embedded import start_embedded_postgres, stop_embedded_postgres
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import metadata

TEST_DATABASE_URL_ENV = "MANA_AI_TEST_DATABASE_URL"

TIERS = ("unit", "integration", "e2e")
"""A test's tier is the directory it lives in (``tests/<tier>/``); select one with ``-m``."""


@pytest.fixture(autouse=True)
def process_secrets_restored() -> Iterator[None]:
    """The secrets a test's settings (or the test) gave the process (``worker.redaction``)
    are forgotten after it: another test's text is not masked by them."""
    saved = redaction.redactor()
    yield
    redaction.install(saved.secrets)


@pytest.fixture(autouse=True)
def scripted_models_are_used_up(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``ScriptedChatModel`` a test makes must have played its whole script by the end
    of the test (``assert_exhausted``): a step never requested means the run did not go the
    way the test says. A test that stops a run early on purpose passes ``unused_ok=True``."""
    made: list[ScriptedChatModel] = []
    init = ScriptedChatModel.__init__

    def recording_init(self: ScriptedChatModel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ScriptedChatModel, "__init__", recording_init)
    yield
    for model in made:
        model.assert_exhausted()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier (``tests/unit`` → ``unit``, ...), so ``pytest -m unit``
    or ``-m "not e2e"`` selects by tier; a test outside the tier directories is an error."""
    root = Path(__file__).parent
    for item in items:
        try:
            tier = item.path.relative_to(root).parts[0]
        except ValueError:
            continue
        if tier not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: tests live in tests/unit, tests/integration or tests/e2e"
            )
        item.add_marker(tier)


def embedded_tempdir(prefix: str = "mana-ai-embedded-") -> Path:
    """A new temporary directory for an embedded PostgreSQL (delete it when done). Mode
    ``0755``: run as root, the server runs as the system user ``embedded_postgres``, which
    must be able to enter it, and mana-ai never loosens a directory it did not create."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


@pytest.fixture
def embedded_dir() -> Iterator[Path]:
    """An ``embedded_tempdir``, deleted after the test (stop any server in it first)."""
    path = embedded_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- database ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """asyncpg URL of a database on the test server from which databases can be created."""
    configured = os.environ.get(TEST_DATABASE_URL_ENV)
    if configured:
        yield to_async_url(configured)
        return
    workdir = embedded_tempdir("mana-ai-test-")
    pgdata = workdir / "pgdata"
    try:
        yield start_embedded_postgres(pgdata, database="postgres", cleanup_mode="delete")
    finally:
        stop_embedded_postgres(pgdata)
        shutil.rmtree(workdir, ignore_errors=True)


async def create_database(admin_url: str, prefix: str = "mana_ai_test") -> str:
    """Create a uniquely named empty database next to ``admin_url``'s; return its URL."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    await _admin(admin_url, f'CREATE DATABASE "{name}"')
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


async def drop_database(admin_url: str, url: str) -> None:
    """Drop the database ``url`` names, disconnecting whoever is still connected to it."""
    name = make_url(url).database
    await _admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _admin(admin_url: str, statement: str) -> None:
    # CREATE / DROP DATABASE cannot run inside a transaction block.
    engine = create_async_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
async def database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A fresh database for this test session, migrated to head; dropped at the end."""
    url = await create_database(postgres_admin_url)
    try:
        migrator = create_engine(url)
        try:
            await upgrade_database(migrator)
        finally:
            await migrator.dispose()
        yield url
    finally:
        await drop_database(postgres_admin_url, url)


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on ``database_url`` shared by the session; disposed at the end."""
    shared = create_engine(database_url)
    try:
        yield shared
    finally:
        await shared.dispose()


@pytest.fixture(scope="session")
async def emptying_script(engine: AsyncEngine) -> str:
    """The SQL that empties every table and restarts every identity: ``DELETE`` children
    first, then ``setval`` of each identity's sequence. Tests leave a few rows, and on those
    this takes about 0.5 ms where ``TRUNCATE … RESTART IDENTITY`` took 29 ms (it rewrites
    every table's files): over the integration tier, 15 s."""
    async with engine.connect() as conn:
        sequences = (
            await conn.execute(
                text(
                    "SELECT pg_get_serial_sequence(format('%I', table_name), column_name) "
                    "FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND is_identity = 'YES'"
                )
            )
        ).scalars()
        restarts = ", ".join(f"setval('{name}', 1, false)" for name in sequences if name)
    deletes = "; ".join(f'DELETE FROM "{t.name}"' for t in reversed(metadata.sorted_tables))
    return f"{deletes}; SELECT {restarts}" if restarts else deletes


@pytest.fixture
async def db(engine: AsyncEngine, emptying_script: str) -> AsyncIterator[AsyncEngine]:
    """``engine`` on empty tables (identities restarted), for test isolation."""
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        await raw.driver_connection.execute(emptying_script)  # type: ignore[union-attr]
        await conn.commit()
    yield engine
    checked_out = engine.pool.checkedout()  # type: ignore[attr-defined]
    assert checked_out == 0, f"the test left {checked_out} database connection(s) checked out"


@pytest.fixture
async def empty_database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A fresh database that was never migrated; dropped after the test."""
    url = await create_database(postgres_admin_url, prefix="mana_ai_empty")
    try:
        yield url
    finally:
        await drop_database(postgres_admin_url, url)


@pytest.fixture(scope="session")
def pgbouncer(postgres_admin_url: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test server, shared by the session.

    Skips the test when PgBouncer is not installed ("pgbouncer not installed: apt-get install
    pgbouncer"); fails it when PgBouncer is installed but does not start.
    """
    try:
        bouncer = start_pgbouncer(postgres_admin_url)
    except PgBouncerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield bouncer
    finally:
        bouncer.stop()
