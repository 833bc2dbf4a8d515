"""A park for an approval, as tests build one: the request and the checkpoint of a claimed
mission's run parked at its first call (``MissionStore.end_run`` with a ``Parked`` end)."""

from __future__ import annotations

from datetime import timedelta

from worker.store.records import ApprovalRequestRow, ClaimedMission, RoundCheckpoint

CHECKPOINT = RoundCheckpoint(
    messages=[{"role": "user", "content": "Go."}],
    rounds=1,
    prompt_tokens=1,
    completion_tokens=1,
    reminders=[],
)
"""A parked run's checkpoint: one round."""


def approval_request_of(mission: ClaimedMission) -> ApprovalRequestRow:
    """The approval request of ``mission``'s run (it must have its iteration) parked at round
    1's first call, a destructive ``notes_delete``."""
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
