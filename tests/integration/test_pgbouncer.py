"""The tick, the policy ledger and migrations through a real PgBouncer in transaction mode.

PgBouncer (``tests/pgbouncer.py``) gives the worker 3 server connections for its 10 client
connections, so transactions of different missions interleave on shared server connections:
whatever relies on session state (named prepared statements that outlive a transaction, session
advisory locks, statements prepared and executed outside a transaction) fails here.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse
from planner.policy import PolicyConfig, RateLimit
from planner.testing import FunctionChatModel
from tests.integration.worker_harness import (
    add_mission,
    clock_then_answer,
    iterations,
    make_worker,
    policy_setup,
)
from tests.pgbouncer import PgBouncer
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.migrate import current_revision, head_revision, upgrade_database
from worker.db.tables import tool_invocations

MISSIONS = 20
LIMIT = 15  # clock_now calls allowed per user in the window: the ledger must count exactly


def server_connections(bouncer: PgBouncer, database: str) -> tuple[int, int]:
    """(client logins, server connections opened) PgBouncer logged for ``database``."""
    log = bouncer.read_log()
    logins = len(re.findall(rf"login attempt: db={re.escape(database)} ", log))
    servers = len(re.findall(rf" {re.escape(database)}/\S+ new connection to server", log))
    return logins, servers


async def test_the_tick_with_the_policy_ledger_runs_through_pgbouncer_in_transaction_mode(
    db: AsyncEngine, bounced: AsyncEngine, pgbouncer: PgBouncer, database_url: str
) -> None:
    ids = [await add_mission(db, agent=f"agent-{i % 4}") for i in range(MISSIONS)]

    async def interleaving(request: CompletionRequest) -> CompletionResponse:
        await asyncio.sleep(0.01)  # every mission is mid-run at once
        return clock_then_answer(request)

    config = PolicyConfig(rate_limit=RateLimit(calls=LIMIT, window=timedelta(minutes=10)))
    worker: Worker = make_worker(
        bounced,
        FunctionChatModel(interleaving),
        max_concurrent=MISSIONS,
        policy=policy_setup(bounced, "enforce", config),
    )
    outcomes: list[str] = []
    while batch := await worker.run_once():
        outcomes += batch

    assert outcomes == ["succeeded"] * MISSIONS
    stored = await iterations(db)
    assert sorted(i["mission_id"] for i in stored) == sorted(ids)
    assert all(i["status"] == "succeeded" and i["rounds"] == 2 for i in stored)
    async with db.connect() as conn:
        calls = (await conn.execute(select(tool_invocations))).mappings().all()
    assert len(calls) == MISSIONS
    # the ledger's advisory lock counted exactly across the shared server connections
    assert sorted(c["outcome"] for c in calls).count("ok") == LIMIT
    denied = [c for c in calls if c["outcome"] != "ok"]
    assert [c["policy_decision"]["reason"] for c in denied] == ["rate_limited"] * (MISSIONS - LIMIT)
    # it really went through PgBouncer, many clients over at most 3 server connections
    logins, servers = server_connections(pgbouncer, make_url(database_url).database or "")
    assert logins >= 4 and 1 <= servers <= 3, pgbouncer.read_log()[-2000:]
    assert bounced.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_concurrent_upgrades_through_pgbouncer_both_reach_head(
    pgbouncer: PgBouncer, empty_database_url: str
) -> None:
    url = pgbouncer.url_for(empty_database_url)
    replicas = [create_engine(url, pgbouncer=True) for _ in range(2)]
    try:
        revisions = await asyncio.gather(*(upgrade_database(e) for e in replicas))
        assert revisions == [head_revision(), head_revision()]
        assert await current_revision(replicas[0]) == head_revision()
        async with replicas[1].connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        assert versions == [(head_revision(),)]
    finally:
        for engine in replicas:
            await engine.dispose()
