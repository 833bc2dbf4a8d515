"""The in-memory store's park for an approval, as PostgreSQL's: its repeat by the same attempt
(after an answer the worker never got) reads the request as this attempt's, new to whoever
is told of requests; an earlier attempt's request at the same park is not."""

from __future__ import annotations

from datetime import timedelta

from tests.parks import CHECKPOINT, approval_request_of
from worker.store.memory import InMemoryMissionStore
from worker.store.records import ClaimedMission, Parked

LEASE = timedelta(seconds=60)


async def park(store: InMemoryMissionStore, mission: ClaimedMission) -> bool:
    assert mission.iteration is not None
    end = Parked(
        mission.iteration.id, mission.iteration.attempt, approval_request_of(mission), CHECKPOINT
    )
    parked = (await store.end_run(mission, end, worker_id="w1")).parked
    assert parked is not None
    return parked.created


async def test_a_parks_repeat_by_the_same_attempt_reads_its_request_as_new() -> None:
    store = InMemoryMissionStore()
    store.add_mission(store.add_agent("a1"))
    [mission] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert await park(store, mission)
    assert await park(store, mission)  # the repeat: the lease is released, the park stored
    assert len(store.approvals) == 1


async def test_a_request_of_an_earlier_attempt_at_the_same_park_is_not_new() -> None:
    store = InMemoryMissionStore()
    store.add_mission(store.add_agent("a1"))
    [mission] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert await park(store, mission)
    store.approvals[0]["attempt"] = 0  # as if an earlier attempt had asked
    assert not await park(store, mission)
