"""Migrations: they build the schema in ``worker.db.tables``, are idempotent, serialise
concurrent replicas with the advisory lock, and the daemon's embedded database gets them too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, MetaData, Text, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.embedded import stop_embedded_postgres
from worker.db.engine import create_engine, resolve_database_url
from worker.db.migrate import (
    MIGRATION_LOCK_KEY,
    alembic_config,
    current_revision,
    head_revision,
    migration_lock,
    upgrade_database,
)
from worker.db.tables import metadata
from worker.errors import DatabaseError
from worker.settings import Settings

EXPECTED_TABLES = {
    "agents",
    "missions",
    "mission_iterations",
    "tool_invocations",
    "notes",
    "user_policy_settings",
    "policy_call_events",
    "compacted_turns",
    "mcp_tokens",
    "agent_mcp_servers",
    "approval_requests",
    "admin_tokens",
    "admin_sessions",
}


@pytest.fixture
async def fresh(empty_database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a database that was never migrated."""
    engine = create_engine(empty_database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def table_names(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))


async def schema_diff(engine: AsyncEngine, target: MetaData) -> list[Any]:
    """alembic's autogenerate comparison of the live schema against ``target``."""

    def compare(sync: Connection) -> list[Any]:
        context = MigrationContext.configure(sync, opts={"compare_server_default": True})
        return list(compare_metadata(context, target))

    async with engine.connect() as conn:
        return await conn.run_sync(compare)


async def wait_until(
    condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0
) -> None:
    """Poll ``condition`` (a database state, so there is no event to wait on) until true."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await condition():  # noqa: ASYNC110 - polls the server's state
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}") from None


# --- upgrade ----------------------------------------------------------------------------------


async def test_upgrade_creates_every_table(fresh: AsyncEngine) -> None:
    assert await current_revision(fresh) is None
    assert await table_names(fresh) == set()

    revision = await upgrade_database(fresh)

    assert revision == head_revision() == "0013"
    assert await current_revision(fresh) == revision
    assert await table_names(fresh) == EXPECTED_TABLES | {"alembic_version"}
    assert set(metadata.tables) == EXPECTED_TABLES


async def test_upgrading_twice_is_a_no_op(fresh: AsyncEngine) -> None:
    first = await upgrade_database(fresh)
    async with fresh.begin() as conn:
        await conn.execute(text("INSERT INTO notes (user_id, title) VALUES ('alice', 'survives')"))

    assert await upgrade_database(fresh) == first

    async with fresh.connect() as conn:
        assert (await conn.execute(text("SELECT title FROM notes"))).scalars().all() == ["survives"]
        versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
    assert versions == [(first,)]


async def test_concurrent_upgrades_of_a_fresh_database_both_succeed(
    empty_database_url: str,
) -> None:
    # Two engines, as two replicas starting together would have.
    replicas = [create_engine(empty_database_url) for _ in range(2)]
    try:
        revisions = await asyncio.gather(*(upgrade_database(e) for e in replicas))
        assert revisions == [head_revision(), head_revision()]
        assert await table_names(replicas[0]) == EXPECTED_TABLES | {"alembic_version"}
    finally:
        for engine in replicas:
            await engine.dispose()


async def test_upgrade_waits_for_the_migration_lock(fresh: AsyncEngine) -> None:
    async def upgrade_is_waiting_for_the_lock() -> bool:
        async with fresh.connect() as conn:
            waiting = await conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND classid = :high AND objid = :low AND objsubid = 1"
                ),
                {"high": MIGRATION_LOCK_KEY >> 32, "low": MIGRATION_LOCK_KEY & 0xFFFFFFFF},
            )
            return bool(waiting.scalar_one())

    async with fresh.connect() as holder, migration_lock(holder):
        upgrade = asyncio.create_task(upgrade_database(fresh))
        await wait_until(upgrade_is_waiting_for_the_lock, "the upgrade to wait on the lock")
        assert not upgrade.done()
        assert await current_revision(fresh) is None

    assert await upgrade == head_revision()


async def test_the_migrated_schema_matches_the_table_definitions(engine: AsyncEngine) -> None:
    assert await schema_diff(engine, metadata) == []


async def test_the_schema_comparison_does_notice_a_difference(engine: AsyncEngine) -> None:
    drifted = MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.sorted_tables:
        table.to_metadata(drifted)
    drifted.tables["notes"].append_column(Column("tags", Text, nullable=True))

    diff = await schema_diff(engine, drifted)

    assert [(d[0], d[2], d[3].name) for d in diff] == [("add_column", "notes", "tags")]


async def test_downgrade_to_base_and_upgrade_again(fresh: AsyncEngine) -> None:
    await upgrade_database(fresh)

    def downgrade(sync: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = sync
        command.downgrade(config, "base")

    async with fresh.begin() as conn:
        await conn.run_sync(downgrade)
    assert await table_names(fresh) == {"alembic_version"}
    assert await current_revision(fresh) is None
    async with fresh.connect() as conn:  # the migrations' functions go with them
        functions = await conn.execute(
            text("SELECT proname FROM pg_proc WHERE proname LIKE 'mana\\_ai\\_%'")
        )
        assert functions.all() == []

    assert await upgrade_database(fresh) == head_revision()
    assert await schema_diff(fresh, metadata) == []


async def test_0006_keeps_mission_calls_and_takes_mcp_calls_without_an_iteration(
    fresh: AsyncEngine,
) -> None:
    def upgrade_to(revision: str) -> Callable[[Connection], None]:
        def run(sync: Connection) -> None:
            config = alembic_config()
            config.attributes["connection"] = sync
            command.upgrade(config, revision)

        return run

    async with fresh.begin() as conn:
        await conn.run_sync(upgrade_to("0005"))
        for statement in (
            "INSERT INTO agents (name, owner_user_id, system_prompt) VALUES ('a', 'u', 's')",
            "INSERT INTO missions (agent_id, objective) VALUES (1, 'o')",
            "INSERT INTO mission_iterations (mission_id, scheduled_for, status, worker_id)"
            " VALUES (1, now(), 'succeeded', 'w')",
            "INSERT INTO tool_invocations (iteration_id, mission_id, user_id, round, call_id,"
            " tool, arguments, outcome) VALUES (1, 1, 'u', 1, 'c1', 'clock_now', '{}', 'ok')",
        ):
            await conn.execute(text(statement))
    async with fresh.begin() as conn:
        await conn.run_sync(upgrade_to("0006"))
    async with fresh.begin() as conn:
        consumer = await conn.execute(text("SELECT consumer FROM tool_invocations"))
        assert consumer.scalars().all() == ["mission"]
        await conn.execute(
            text(
                "INSERT INTO tool_invocations (user_id, call_id, tool, arguments, outcome,"
                " consumer) VALUES ('u', 'c2', 'notes_list', '{}', 'ok', 'mcp')"
            )
        )
    with pytest.raises(Exception, match="ck_tool_invocations_mission_call"):
        async with fresh.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO tool_invocations (user_id, call_id, tool, arguments, outcome)"
                    " VALUES ('u', 'c3', 'notes_list', '{}', 'ok')"
                )
            )


async def test_an_unreachable_database_is_a_clear_error_without_the_password() -> None:
    engine = create_engine("postgresql://mana:hunter2@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(DatabaseError) as caught:
            await upgrade_database(engine)
    finally:
        await engine.dispose()
    message = str(caught.value)
    assert message.startswith("could not migrate postgresql+asyncpg://mana:***@127.0.0.1:1/nowhere")
    assert "hunter2" not in message


# --- the daemon's default database ------------------------------------------------------------


async def test_without_a_url_the_embedded_database_is_started_and_migrated(
    embedded_dir: Path,
) -> None:
    data_dir = embedded_dir
    pgdata = data_dir / "pgdata"
    try:
        url = await resolve_database_url(Settings(data_dir=data_dir))
        assert url.startswith("postgresql+asyncpg://postgres@/mana_ai?host=")

        engine = create_engine(url)
        try:
            assert await upgrade_database(engine) == head_revision()
            async with engine.connect() as conn:
                row = (
                    await conn.execute(
                        text("SELECT current_database(), inet_server_addr() IS NULL")
                    )
                ).one()
            assert tuple(row) == ("mana_ai", True)  # over the unix socket, not TCP
        finally:
            await engine.dispose()
        assert (pgdata / "PG_VERSION").is_file()
    finally:
        await asyncio.to_thread(stop_embedded_postgres, pgdata)


async def test_a_configured_url_is_used_as_is() -> None:
    settings = Settings(database_url="postgres://u:p@db.example/mana")
    assert await resolve_database_url(settings) == "postgresql+asyncpg://u:p@db.example/mana"


async def test_a_database_a_newer_mana_ai_migrated_is_named_as_such(
    fresh: AsyncEngine, empty_database_url: str
) -> None:
    # "run `mana-ai db upgrade`" would be advice that cannot work: this version cannot
    from worker.db.configured import open_database

    await upgrade_database(fresh)
    async with fresh.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    settings = Settings(database_url=empty_database_url)
    with pytest.raises(DatabaseError, match="newer than this mana-ai knows") as raised:
        async with open_database(settings, migrate=False):
            pass
    assert "db upgrade" not in str(raised.value)


async def test_0011_keys_the_token_names_and_keeps_the_newest_of_live_namesakes(
    fresh: AsyncEngine,
) -> None:
    from alembic import command

    from worker.db.migrate import alembic_config

    def to_0010(connection: Any) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "0010")

    async with fresh.begin() as conn:
        await conn.run_sync(to_0010)
        for name, revoked in (("Alice", False), ("ALICE", False), ("alice", True), ("bob", False)):
            await conn.execute(
                text(
                    "INSERT INTO admin_tokens (name, token_hash, revoked_at) VALUES "
                    "(:name, md5(random()::text), CASE WHEN :revoked THEN now() END)"
                ),
                {"name": name, "revoked": revoked},
            )
    assert await upgrade_database(fresh) == head_revision()
    async with fresh.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT name, name_key, revoked_at IS NULL FROM admin_tokens ORDER BY id")
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("Alice", "alice", False),  # a newer live "ALICE" keeps the name
        ("ALICE", "alice", True),
        ("alice", "alice", False),
        ("bob", "bob", True),
    ]


async def test_0012_gives_every_mission_the_catch_up_it_had_and_refuses_other_policies(
    fresh: AsyncEngine,
) -> None:
    from alembic import command
    from sqlalchemy.exc import IntegrityError

    from worker.db.migrate import alembic_config

    def to_0011(connection: Any) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, "0011")

    async with fresh.begin() as conn:
        await conn.run_sync(to_0011)
        await conn.execute(
            text("INSERT INTO agents (name, owner_user_id, system_prompt) VALUES ('a', 'u', 's')")
        )
        await conn.execute(
            text(
                "INSERT INTO missions (agent_id, objective, cron, next_run_at) "
                "SELECT id, 'o', '0 * * * *', now() FROM agents"
            )
        )
    assert await upgrade_database(fresh) == head_revision()
    async with fresh.connect() as conn:
        row = (await conn.execute(text("SELECT catch_up, catch_up_window FROM missions"))).one()
    assert tuple(row) == ("once", None)  # missed runs collapse into one, as before
    for change in ("catch_up = 'sometimes'", "catch_up_window = interval '-1 hour'"):
        with pytest.raises(IntegrityError):
            async with fresh.begin() as conn:
                await conn.execute(text(f"UPDATE missions SET {change}"))
