"""How a run's end is stored in memory (``MissionStore.end_run``), as PostgreSQL's end
statements store it (``worker.store.writes.ends``): the base of
``worker.store.memory.InMemoryMissionStore``."""

from __future__ import annotations

import dataclasses

from worker.store.memory_rows import MemoryTables
from worker.store.records import (
    ClaimedMission,
    ClaimOrder,
    EndResult,
    Finished,
    Interrupted,
    IterationOutcome,
    NoRun,
    Parked,
    ParkedRun,
    RoundCheckpoint,
    RunEnd,
)

__all__ = ["MemoryEnds"]


class MemoryEnds(MemoryTables):
    """``end_run`` on the in-memory rows."""

    async def end_run(
        self,
        mission: ClaimedMission,
        end: RunEnd,
        *,
        worker_id: str,
        claim: ClaimOrder | None = None,
    ) -> EndResult:
        """See ``MissionStore.end_run``: with ``claim``, the claim is made once the end is
        stored (never of the finished mission), as PostgreSQL's statement makes it."""
        self._enter("end_run")
        if claim is not None and not isinstance(end, Finished):
            raise ValueError(f"only a finished run claims ahead, not {type(end).__name__}")
        parked = None
        if isinstance(end, Finished):
            held = self._finish(
                mission, end.iteration_id, end.outcome, worker_id=worker_id, attempt=end.attempt
            )
        elif isinstance(end, NoRun):
            held = self._no_run(mission, end, worker_id=worker_id)
        elif isinstance(end, Interrupted):
            held = self._interrupt(mission, end, worker_id=worker_id)
        else:
            parked = self._park(mission, end, worker_id=worker_id)
            held = parked is not None
        claimed: tuple[ClaimedMission, ...] = ()
        if claim is not None:
            claimed = tuple(
                self._claim(
                    worker_id,
                    claim.limit,
                    claim.lease,
                    claim.default_model,
                    claim.budget_window,
                    besides=mission.id,
                )
            )
        return EndResult(lease_held=held, claimed=claimed, parked=parked)

    def _no_run(self, mission: ClaimedMission, end: NoRun, *, worker_id: str) -> bool:
        if not self._owns(mission.id, worker_id):
            return False
        row = self.missions[mission.id]
        row["next_run_at"] = end.next_run_at
        if row["status"] != "paused":
            row["status"] = end.mission_status
        row["last_error"] = end.error
        row["lease_owner"] = row["lease_expires_at"] = None
        self._end_parked(mission.id)
        return True

    def _finish(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        outcome: IterationOutcome,
        *,
        worker_id: str,
        attempt: int,
    ) -> bool:
        if not self._owns(mission.id, worker_id):
            return self._ended(iteration_id, attempt, worker_id, outcome.status)
        row = self.missions[mission.id]
        row["next_run_at"] = outcome.next_run_at
        if row["status"] != "paused":
            row["status"] = outcome.mission_status
        row["last_error"] = outcome.error
        row["lease_owner"] = row["lease_expires_at"] = None
        self._checkpoint(
            iteration_id,
            RoundCheckpoint(
                messages=outcome.messages,
                rounds=outcome.rounds,
                prompt_tokens=outcome.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                reminders=outcome.reminders,
                archive=outcome.archive,
            ),
            mission,
        )
        self.iterations[iteration_id] |= {
            "status": outcome.status,
            "stop_reason": outcome.stop_reason,
            "error": outcome.error,
            "finished_at": self.clock(),
        }
        self._put_rows(mission, iteration_id, outcome.tool_invocations)
        return True

    def _interrupt(self, mission: ClaimedMission, end: Interrupted, *, worker_id: str) -> bool:
        if not self._owns(mission.id, worker_id):
            return self._ended(end.iteration_id, end.attempt, worker_id, "failed")
        row = self.missions[mission.id]
        row["lease_owner"] = row["lease_expires_at"] = None
        if end.checkpoint is not None:
            self._checkpoint(end.iteration_id, end.checkpoint, mission)
        self.iterations[end.iteration_id] |= {
            "status": "failed",
            "stop_reason": "interrupted",
            "error": end.reason,
            "finished_at": self.clock(),
        }
        self._put_rows(mission, end.iteration_id, end.invocations)
        return True

    def _park(self, mission: ClaimedMission, end: Parked, *, worker_id: str) -> ParkedRun | None:
        request, iteration_id, attempt = end.request, end.iteration_id, end.attempt
        checkpoint, invocations = end.checkpoint, end.invocations
        found = next(
            (
                r
                for r in self.approvals
                if r["consumer"] == "mission"
                and r["iteration_id"] == request.iteration_id
                and (r["round"], r["position"]) == (request.round, request.position)
            ),
            None,
        )
        if not self._owns(mission.id, worker_id):
            if found is not None and self._ended(
                iteration_id, attempt, worker_id, "awaiting_approval"
            ):
                return ParkedRun(found["id"], found["attempt"] == attempt, found["expires_at"])
            return None
        row = self.missions[mission.id]
        row["lease_owner"] = row["lease_expires_at"] = None
        self._checkpoint(iteration_id, checkpoint, mission)
        self.iterations[iteration_id] |= {
            "status": "awaiting_approval",
            "stop_reason": "awaiting_approval",
            "error": None,
            "finished_at": self.clock(),
        }
        self._put_rows(mission, iteration_id, invocations)
        if found is not None:
            return ParkedRun(found["id"], found["attempt"] == attempt, found["expires_at"])
        found = dataclasses.asdict(request) | {
            "id": next(self._ids),
            "status": "pending",
            "created_at": self.clock(),
            "expires_at": self.clock() + request.ttl,
            "decided_by": None,
            "decided_at": None,
            "decision_note": None,
            "used_at": None,
        }
        del found["ttl"]
        self.approvals.append(found)
        return ParkedRun(found["id"], True, found["expires_at"])
