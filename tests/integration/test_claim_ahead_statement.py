"""A finish that claims (``end_run(..., claim=ClaimOrder)``) on real PostgreSQL: one
statement stores the run's end and leases the worker's next due missions, exactly as a claim
made after the finish would (their iterations started, the agent's settings read, the
finished run's tokens counted toward its agent's daily budget), never the finished mission
itself; and a worker with a backlog runs every mission this way, directly and through
PgBouncer in transaction mode.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse
from planner.testing import FunctionChatModel
from tests.backlog import run_until_stored
from tests.integration.worker_harness import (
    add_mission,
    clock_then_answer,
    iterations,
    make_worker,
    mission_row,
)
from worker.daemon.worker import Worker
from worker.db.statuses import IterationStatus, MissionStatus
from worker.db.tables import agents, missions
from worker.store.postgres import PostgresMissionStore
from worker.store.records import (
    ClaimedMission,
    ClaimOrder,
    Finished,
    IterationOutcome,
    RoundCheckpoint,
)

LEASE = timedelta(seconds=60)


def ended(tokens: int, next_run_at: datetime | None) -> IterationOutcome:
    return IterationOutcome(
        status=IterationStatus.SUCCEEDED,
        messages=[{"role": "assistant", "content": "Done."}],
        rounds=1,
        prompt_tokens=tokens,
        completion_tokens=1,
        stop_reason=None,
        error=None,
        next_run_at=next_run_at,
        mission_status=MissionStatus.ACTIVE,
    )


def run_end(mission: ClaimedMission, outcome: IterationOutcome) -> Finished:
    assert mission.iteration is not None
    return Finished(mission.iteration.id, mission.iteration.attempt, outcome)


async def claim_one(store: PostgresMissionStore) -> ClaimedMission:
    [mission] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert mission.iteration is not None
    return mission


async def test_a_finish_claims_what_a_claim_after_it_would(db: AsyncEngine) -> None:
    first = await add_mission(db, due_in=timedelta(seconds=-3))
    later = [await add_mission(db, due_in=timedelta(seconds=-2)) for _ in range(2)]
    async with db.begin() as conn:
        await conn.execute(update(agents).values(max_tokens_per_day=1000, model="m1"))
    store = PostgresMissionStore(db)
    mission = await claim_one(store)
    assert mission.id == first
    order = ClaimOrder(limit=5, lease=LEASE)
    next_hour = datetime.now(UTC) + timedelta(hours=1)
    result = await store.end_run(
        mission, run_end(mission, ended(40, next_hour)), worker_id="w1", claim=order
    )
    assert result.lease_held
    assert [m.id for m in result.claimed] == later
    for claimed in result.claimed:
        assert claimed.iteration is not None and claimed.iteration.attempt == 1
        assert (claimed.agent_name, claimed.model, claimed.max_tokens_per_day) == ("a1", "m1", 1000)
        assert claimed.tokens_used_24h == 41  # the finished run's tokens, as stored just now
        row = await mission_row(db, claimed.id)
        assert row["lease_owner"] == "w1" and row["lease_expires_at"] > datetime.now(UTC)
    finished = await mission_row(db, first)
    assert (finished["lease_owner"], finished["next_run_at"]) == (None, next_hour)
    [done, *started] = await iterations(db)
    assert (done["status"], done["prompt_tokens"]) == ("succeeded", 40)
    assert [i["status"] for i in started] == ["running", "running"]

    # the same budget a claim made after the finish reads
    await store.end_run(
        result.claimed[0], run_end(result.claimed[0], ended(0, None)), worker_id="w1"
    )
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == later[1])
            .values(lease_owner=None, lease_expires_at=None)
        )
    [again] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert (again.id, again.tokens_used_24h) == (later[1], 42)


async def test_a_finish_never_claims_its_own_mission_even_when_it_is_due_again(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db, due_in=timedelta(seconds=-1))
    store = PostgresMissionStore(db)
    mission = await claim_one(store)
    async with db.begin() as conn:  # the lease ran out while the run went on
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    order = ClaimOrder(limit=5, lease=LEASE)
    due_again = datetime.now(UTC) - timedelta(seconds=1)
    result = await store.end_run(
        mission, run_end(mission, ended(1, due_again)), worker_id="w1", claim=order
    )
    assert result.lease_held and result.claimed == ()
    [again] = await store.claim_due(worker_id="w1", limit=5, lease=LEASE)
    assert (again.id, again.scheduled_for) == (mission_id, due_again)


async def test_a_finish_whose_lease_was_lost_stores_nothing_and_still_claims(
    db: AsyncEngine,
) -> None:
    await add_mission(db, due_in=timedelta(seconds=-2))
    other = await add_mission(db, due_in=timedelta(seconds=-1))
    async with db.begin() as conn:
        await conn.execute(update(agents).values(max_tokens_per_day=1000))
    store = PostgresMissionStore(db)
    mission = await claim_one(store)
    assert mission.iteration is not None
    checkpoint = RoundCheckpoint(
        messages=[], rounds=1, prompt_tokens=50, completion_tokens=10, reminders=[]
    )
    await store.commit_round(mission, mission.iteration.id, checkpoint, [], worker_id="w1")
    async with db.begin() as conn:  # another worker took it over
        await conn.execute(
            update(missions).where(missions.c.id == mission.id).values(lease_owner="w2")
        )
    order = ClaimOrder(limit=5, lease=LEASE)
    result = await store.end_run(
        mission, run_end(mission, ended(500, None)), worker_id="w1", claim=order
    )
    assert not result.lease_held
    [claimed] = result.claimed
    # the run's tokens as its row has them (its last checkpoint): the finish stored nothing
    assert claimed.id == other and claimed.tokens_used_24h == 60
    row = await mission_row(db, mission.id)
    assert row["lease_owner"] == "w2"


class Answers:
    """``clock_then_answer`` after a pause, noting the most missions leased at once."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.most_leased = 0

    async def __call__(self, request: CompletionRequest) -> CompletionResponse:
        async with self.engine.connect() as conn:
            leased = (
                await conn.execute(select(missions.c.id).where(missions.c.lease_owner == "w1"))
            ).all()
        self.most_leased = max(self.most_leased, len(leased))
        await asyncio.sleep(0.005)
        return clock_then_answer(request)


async def run_backlog(engine: AsyncEngine, db: AsyncEngine, count: int) -> tuple[Worker, Any]:
    answers = Answers(db)
    worker = make_worker(engine, FunctionChatModel(answers), max_concurrent=3)
    claims = 0
    store = worker.store
    claim_due = store.claim_due

    async def counted(**kwargs: Any) -> list[ClaimedMission]:
        nonlocal claims
        claims += 1
        return await claim_due(**kwargs)

    store.claim_due = counted  # type: ignore[method-assign]
    await run_until_stored(worker, count)
    return worker, (claims, answers.most_leased)


async def test_a_backlog_runs_with_one_statement_per_mission_to_start_and_end_it(
    db: AsyncEngine,
) -> None:
    ids = [await add_mission(db, due_in=timedelta(seconds=-1)) for _ in range(10)]
    _, (claims, most_leased) = await run_backlog(db, db, 10)
    stored = await iterations(db)
    assert sorted(i["mission_id"] for i in stored) == ids
    assert all(i["status"] == "succeeded" and i["rounds"] == 2 for i in stored)
    # the first tick claimed 3 and the rest came with finishes; at the backlog's end the
    # finishes' claims under way come back short (SKIP LOCKED: the last due missions went to
    # the others), and each wakes a tick for its slot: one per slot at most
    assert claims <= 1 + 3 and most_leased <= 3


async def test_a_backlog_runs_through_pgbouncer_in_transaction_mode(
    db: AsyncEngine,
    bounced: AsyncEngine,
) -> None:
    ids = [await add_mission(db, due_in=timedelta(seconds=-1)) for _ in range(8)]
    _, (claims, most_leased) = await run_backlog(bounced, db, 8)
    stored = await iterations(db)
    assert sorted(i["mission_id"] for i in stored) == ids
    assert all(i["status"] == "succeeded" for i in stored)
    assert claims <= 1 + 3 and most_leased <= 3
