"""The in-memory store's park for an approval, as PostgreSQL's: its repeat by the same attempt
(after an answer the worker never got) reads the request as this attempt's, new to whoever
is told of requests; an earlier attempt's request at the same park is not."""

from __future__ import annotations

from datetime import timedelta

from worker.store.base import ApprovalRequestRow, ClaimedMission, RoundCheckpoint
from worker.store.memory import InMemoryMissionStore

LEASE = timedelta(seconds=60)
CHECKPOINT = RoundCheckpoint(
    messages=[], rounds=1, prompt_tokens=1, completion_tokens=1, reminders=[]
)


def request_of(mission: ClaimedMission) -> ApprovalRequestRow:
    assert mission.iteration is not None
    return ApprovalRequestRow(
        consumer="mission",
        user_id=mission.owner_user_id,
        call_id="call_1",
        tool="notes_delete",
        arguments={"title": "x"},
        arguments_hash="0" * 64,
        reason="destructive",
        ttl=timedelta(hours=1),
        agent_id=mission.agent_id,
        mission_id=mission.id,
        iteration_id=mission.iteration.id,
        attempt=mission.iteration.attempt,
        round=1,
        position=0,
    )


async def park(store: InMemoryMissionStore, mission: ClaimedMission) -> bool:
    assert mission.iteration is not None
    parked = await store.park_iteration(
        mission,
        mission.iteration.id,
        request_of(mission),
        worker_id="w1",
        checkpoint=CHECKPOINT,
        attempt=mission.iteration.attempt,
    )
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
