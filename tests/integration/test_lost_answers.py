"""A statement whose answer is lost (the server committed it, the connection dropped before
the answer came: ``FlakyProxy.lose_next_answer``) is run again only when a second run is
harmless. A claim is not: run again, it leased more missions while those the first run
leased waited, unseen, for their lease to expire. A finish without a claim is: run again,
it finds itself stored. A park for an approval is run again too, and its repeat says the
request is new (nobody was told of it yet: the webhook is sent then). And a connection the
server already ended is replaced before a statement is sent on it, so that a claim still
runs once when the pool held a dead one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes.db_proxy import FlakyProxy
from tests.integration.worker_harness import add_mission, iterations, mission_row
from tests.parks import CHECKPOINT, approval_request_of
from worker.db.engine import create_engine
from worker.db.statuses import IterationStatus, MissionStatus
from worker.db.tables import missions
from worker.store.postgres import PostgresMissionStore
from worker.store.records import ClaimedMission, ClaimOrder, Finished, IterationOutcome, Parked

LEASE = timedelta(seconds=60)


@pytest.fixture
async def store(proxy: FlakyProxy, database_url: str) -> AsyncIterator[PostgresMissionStore]:
    """The worker's store, through the proxy (the test reads through ``db``, directly)."""
    engine = create_engine(proxy.url_for(database_url), pool_size=2, max_overflow=0)
    yield PostgresMissionStore(engine)
    await engine.dispose()


async def leased_to(db: AsyncEngine, worker_id: str) -> list[int]:
    async with db.connect() as conn:
        rows = await conn.execute(
            select(missions.c.id).where(missions.c.lease_owner == worker_id).order_by("id")
        )
        return list(rows.scalars())


def ended(mission: ClaimedMission) -> Finished:
    """``mission``'s run, finished (the first attempt)."""
    assert mission.iteration is not None
    return Finished(mission.iteration.id, mission.iteration.attempt, outcome())


def outcome() -> IterationOutcome:
    return IterationOutcome(
        status=IterationStatus.SUCCEEDED,
        messages=[{"role": "assistant", "content": "Done."}],
        rounds=1,
        prompt_tokens=10,
        completion_tokens=1,
        stop_reason=None,
        error=None,
        next_run_at=datetime.now(UTC) + timedelta(hours=1),
        mission_status=MissionStatus.ACTIVE,
    )


async def claimed_one(store: PostgresMissionStore) -> ClaimedMission:
    [mission] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert mission.iteration is not None
    return mission


async def test_a_claim_whose_answer_is_lost_is_not_run_again(
    db: AsyncEngine, proxy: FlakyProxy, store: PostgresMissionStore
) -> None:
    due = [await add_mission(db, due_in=timedelta(seconds=-3 + i)) for i in range(3)]
    async with store.engine.connect() as conn:  # open: the claim is its next statement
        await conn.execute(text("SELECT 1"))
    proxy.lose_next_answer()
    with pytest.raises(DBAPIError):
        await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert proxy.lost_answers == 1
    # the claim committed once: one mission leased (until its lease expires), not two
    assert await leased_to(db, "w1") == due[:1]
    assert [m.id for m in await store.claim_due(worker_id="w1", limit=5, lease=LEASE)] == due[1:]


async def test_a_finish_that_claims_is_not_run_again_when_its_answer_is_lost(
    db: AsyncEngine, proxy: FlakyProxy, store: PostgresMissionStore
) -> None:
    first = await add_mission(db, due_in=timedelta(seconds=-3))
    later = [await add_mission(db, due_in=timedelta(seconds=-2 + i)) for i in range(2)]
    mission = await claimed_one(store)
    assert mission.id == first
    assert mission.iteration is not None
    order = ClaimOrder(limit=1, lease=LEASE)
    proxy.lose_next_answer()
    with pytest.raises(DBAPIError):
        await store.end_run(mission, ended(mission), worker_id="w1", claim=order)
    assert proxy.lost_answers == 1
    # stored, and one mission claimed with it: the statement ran once
    assert (await mission_row(db, first))["lease_owner"] is None
    assert await leased_to(db, "w1") == later[:1]
    # the runner's repeat carries no claim (``worker.run.ending``): it finds the finish stored
    assert (await store.end_run(mission, ended(mission), worker_id="w1")).lease_held
    assert await leased_to(db, "w1") == later[:1]
    assert [it["status"] for it in await iterations(db)] == ["succeeded", "running"]


async def test_a_finish_whose_answer_is_lost_is_run_again_and_finds_itself_stored(
    db: AsyncEngine, proxy: FlakyProxy, store: PostgresMissionStore
) -> None:
    first = await add_mission(db, due_in=timedelta(seconds=-3))
    mission = await claimed_one(store)
    assert mission.iteration is not None
    proxy.lose_next_answer()
    assert (await store.end_run(mission, ended(mission), worker_id="w1")).lease_held
    assert proxy.lost_answers == 1
    assert (await mission_row(db, first))["lease_owner"] is None
    [stored] = await iterations(db)
    assert (stored["status"], stored["prompt_tokens"]) == ("succeeded", 10)


async def test_a_park_whose_answer_is_lost_says_its_request_is_new_when_run_again(
    db: AsyncEngine, proxy: FlakyProxy, store: PostgresMissionStore
) -> None:
    await add_mission(db, due_in=timedelta(seconds=-1))
    mission = await claimed_one(store)
    assert mission.iteration is not None
    iteration = mission.iteration
    proxy.lose_next_answer()
    end = Parked(iteration.id, iteration.attempt, approval_request_of(mission), CHECKPOINT)
    parked = (await store.end_run(mission, end, worker_id="w1")).parked
    assert proxy.lost_answers == 1
    assert parked is not None and parked.created  # the first run inserted it; nobody knew
    async with db.connect() as conn:
        count = await conn.execute(text("SELECT count(*) FROM approval_requests"))
        assert count.scalar_one() == 1


async def test_a_connection_the_server_ended_is_replaced_before_a_claim_is_sent(
    db: AsyncEngine, database_url: str
) -> None:
    due = await add_mission(db, due_in=timedelta(seconds=-1))
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        fairy = await engine.raw_connection()
        driver = fairy.driver_connection
        assert driver is not None
        pid = await driver.fetchval("SELECT pg_backend_pid()")
        fairy.close()  # back in the pool, idle (and not idle long enough to be pinged)
        async with db.connect() as conn:
            assert (await conn.execute(text(f"SELECT pg_terminate_backend({pid})"))).scalar()
        for _ in range(200):  # asyncpg learns it when the server's goodbye is read
            if driver.is_closed():
                break
            await asyncio.sleep(0.01)
        assert driver.is_closed()
        claimed = await PostgresMissionStore(engine).claim_due(worker_id="w1", limit=1, lease=LEASE)
        assert [m.id for m in claimed] == [due]
        async with db.connect() as conn:
            leases = await conn.execute(select(func.count()).where(missions.c.lease_owner == "w1"))
            assert leases.scalar_one() == 1
    finally:
        await engine.dispose()
