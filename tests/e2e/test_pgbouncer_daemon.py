"""``mana-ai`` as processes through a real PgBouncer in transaction mode (``tests/pgbouncer.py``):
``db upgrade`` migrates a fresh database through it, and ``mana-ai worker`` runs due missions,
with the policy gate's ledger, to success through it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    cli,
    clock_then_answer,
    env_for,
    finished_iterations,
    run_cli,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer
from tests.pgbouncer import PgBouncer
from worker.db.engine import create_engine
from worker.db.migrate import head_revision
from worker.db.tables import tool_invocations

MISSIONS = 2


@pytest.fixture
async def direct(empty_database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine straight on the (never migrated) database, to watch what the daemon stores."""
    engine = create_engine(empty_database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_db_upgrade_and_the_worker_run_missions_through_pgbouncer(
    pgbouncer: PgBouncer, empty_database_url: str, direct: AsyncEngine
) -> None:
    with FakeLLMServer(clock_then_answer) as llm:
        env = env_for(
            pgbouncer.url_for(empty_database_url),
            llm.base_url,
            MANA_AI_DB_PGBOUNCER="true",
            MANA_AI_DB_POOL_SIZE="2",
            MANA_AI_POLICY_MODE="enforce",  # the ledger decides every call
            MANA_AI_WORKER_ID="bounced",
        )
        code, out, err = await run_cli(env, "db", "upgrade")
        assert code == 0, err
        assert f"database schema at revision {head_revision()}" in out
        code, out, err = await run_cli(env, "db", "upgrade")  # at head: a no-op
        assert code == 0, err

        await cli(env, "agents", "add", "--name", "clockwatcher", "--owner", "alice")
        ids = [
            (
                await cli(
                    env,
                    "missions",
                    "add",
                    "--agent",
                    "clockwatcher",
                    "--objective",
                    f"Note the time ({n}).",
                    "--due-now",
                )
            )["id"]
            for n in range(MISSIONS)
        ]
        proc = await start_worker(env)
        try:
            done = await wait_until(lambda: _all_finished(direct), f"{MISSIONS} stored iterations")
        finally:
            code, stderr = await stop(proc)
    assert code == 0, stderr
    assert sorted(it["mission_id"] for it in done) == sorted(ids)
    assert all(it["status"] == "succeeded" for it in done), stderr
    assert all(it["worker_id"] == "bounced" for it in done)
    async with direct.connect() as conn:
        calls = (await conn.execute(select(tool_invocations))).mappings().all()
    assert sorted(c["iteration_id"] for c in calls) == sorted(it["id"] for it in done)
    assert {(c["tool"], c["outcome"], c["policy_mode"]) for c in calls} == {
        ("clock_now", "ok", "enforce")
    }
    assert "does not exist" not in stderr and "already exists" not in stderr


async def _all_finished(engine: AsyncEngine) -> list[dict[str, object]]:
    done = await finished_iterations(engine)
    return done if len(done) >= MISSIONS else []
