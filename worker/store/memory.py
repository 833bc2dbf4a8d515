"""The store seam in memory: ``InMemoryMissionStore``, the twin of ``PostgresMissionStore``.

It keeps agents, missions, iterations, tool invocations and compactions in dictionaries and
applies the same rules as the PostgreSQL statements (leases, takeovers, the deadline and the
daily budget, paused missions staying paused, repeats storing once), so the runner, the tick,
the journal and the gate run in unit tests with no database; it also is a ``CallLedger``
(``planner.testing.InMemoryCallLedger``), and ``record_call_start(reserve=...)`` reserves in it.
One process, one event loop: every method runs without an await in between, so each is atomic.

For tests it can fail on purpose: ``fail_next(exc, times=1, methods=...)`` makes the next
calls of the store's methods raise ``exc`` (an ``OSError`` is transient: a database blip).

The model is procrastinate's ``InMemoryConnector``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from planner.gate import Reservation
from planner.policy import RateLimit, UserPolicySettings
from worker.db.statuses import CatchUp
from worker.store.base import LeaseLostError
from worker.store.claim import DEFAULT_CATCH_UP_WINDOW, MISFIRE_GRACE
from worker.store.memory_ends import MemoryEnds
from worker.store.memory_rows import Row
from worker.store.records import (
    CallStart,
    ClaimedMission,
    RoundCheckpoint,
    StartedIteration,
    ToolInvocationRow,
)

__all__ = ["InMemoryMissionStore"]

_TAKEN_OVER = ("running", "awaiting_approval")


@dataclass
class InMemoryMissionStore(MemoryEnds):
    """A ``worker.store.base.MissionStore`` (and ``CallLedger``) in memory; see the module doc.

    Attributes:
        clock: the store's clock, UTC-aware (lease times and ``started_at`` use it).
        agents, missions, iterations: rows by id, with the columns of the tables of the
            same names (``missions`` rows have ``lease_owner`` / ``lease_expires_at``).
        invocations: ``tool_invocations`` rows, in insertion order (``id`` ascending).
        archive: ``compacted_turns`` rows, in insertion order.
        approvals: ``approval_requests`` rows, in insertion order (``decide`` decides one).
        calls: how many times each method was called (what a unit test counts instead of
            round trips).
        user_policies: the owners' policy settings by user id (what the claim reads).
    """

    def add_agent(
        self,
        name: str,
        *,
        owner_user_id: str = "u1",
        system_prompt: str = "Be brief.",
        model: str | None = None,
        max_rounds: int = 5,
        max_tokens_per_day: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        policy_mode: str | None = None,
        compact_max_ctx: int | None = None,
        destructive_policy: str | None = None,
    ) -> int:
        """A new agent; its id."""
        agent_id = next(self._ids)
        self.agents[agent_id] = {
            "id": agent_id,
            "name": name,
            "owner_user_id": owner_user_id,
            "system_prompt": system_prompt,
            "model": model,
            "max_rounds": max_rounds,
            "max_tokens_per_day": max_tokens_per_day,
            "allowed_tools": tuple(allowed_tools) if allowed_tools is not None else None,
            "policy_mode": policy_mode,
            "compact_max_ctx": compact_max_ctx,
            "destructive_policy": destructive_policy,
        }
        return agent_id

    def add_mission(
        self,
        agent_id: int,
        *,
        objective: str = "What time is it?",
        cron: str | None = None,
        timezone: str = "UTC",
        next_run_at: datetime | None = None,
        deadline: datetime | None = None,
        status: str = "active",
        catch_up: CatchUp = CatchUp.ONCE,
        catch_up_window: timedelta | None = None,
    ) -> int:
        """A new mission of ``agent_id`` (due now unless ``next_run_at``); its id."""
        mission_id = next(self._ids)
        self.missions[mission_id] = {
            "id": mission_id,
            "agent_id": agent_id,
            "objective": objective,
            "cron": cron,
            "timezone": timezone,
            "next_run_at": next_run_at or self.clock(),
            "deadline": deadline,
            "status": status,
            "last_error": None,
            "lease_owner": None,
            "lease_expires_at": None,
            "catch_up": catch_up,
            "catch_up_window": catch_up_window,
        }
        return mission_id

    # -- CallLedger ---------------------------------------------------------------------------

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        """See ``planner.gate.CallLedger.reserve``."""
        self._enter("reserve")
        return await self.ledger.reserve(user_id=user_id, tool=tool, limit=limit, consumer=consumer)

    # -- MissionStore -------------------------------------------------------------------------

    async def claim_due(
        self,
        *,
        worker_id: str,
        limit: int,
        lease: timedelta,
        default_model: str | None = None,
        budget_window: timedelta = timedelta(hours=24),
    ) -> list[ClaimedMission]:
        """See ``MissionStore.claim_due``."""
        self._enter("claim_due")
        return self._claim(worker_id, limit, lease, default_model, budget_window)

    def _claim(
        self,
        worker_id: str,
        limit: int,
        lease: timedelta,
        default_model: str | None,
        budget_window: timedelta,
        *,
        besides: int | None = None,
    ) -> list[ClaimedMission]:
        """The claim (``claim_due``), never of mission ``besides``."""
        if limit < 1:
            return []
        now = self.clock()
        claims = []
        for mission in self._due(now, besides)[:limit]:
            mission["lease_owner"] = worker_id
            mission["lease_expires_at"] = now + lease
            agent = self.agents[mission["agent_id"]]
            past_deadline = mission["deadline"] is not None and now > mission["deadline"]
            missed = self._missed(mission, now)
            iteration = None
            if not past_deadline and not missed:
                iteration = self._start_iteration(
                    mission, worker_id, agent["model"] or default_model
                )
            used = None
            if agent["max_tokens_per_day"] is not None:
                used = self._tokens_used(agent["id"], mission, now - budget_window)
            claims.append(
                self._claimed(mission, agent, now, iteration, used, past_deadline, missed)
            )
        return claims

    def _due(self, now: datetime, besides: int | None) -> list[Row]:
        """The missions a claim at ``now`` may lease, the longest due first."""
        return sorted(
            (
                m
                for m in self.missions.values()
                if m["id"] != besides
                and m["status"] == "active"
                and m["next_run_at"] is not None
                and m["next_run_at"] <= now
                and (m["lease_expires_at"] is None or m["lease_expires_at"] < now)
                and (
                    (m["deadline"] is not None and now > m["deadline"])
                    or not self._awaiting_approval(m["id"], now)
                )
            ),
            key=lambda m: m["next_run_at"],
        )

    def _missed(self, mission: Row, now: datetime) -> bool:
        """Whether the run due is one its catch-up policy skips (never started yet)."""
        window = mission["catch_up_window"] or DEFAULT_CATCH_UP_WINDOW
        late = (
            mission["catch_up"] == CatchUp.SKIP and mission["next_run_at"] < now - MISFIRE_GRACE
        ) or (mission["catch_up"] == CatchUp.ALL and mission["next_run_at"] < now - window)
        return late and not any(
            i["mission_id"] == mission["id"] and i["scheduled_for"] == mission["next_run_at"]
            for i in self.iterations.values()
        )

    def _claimed(
        self,
        mission: Row,
        agent: Row,
        now: datetime,
        iteration: StartedIteration | None,
        used: int | None,
        past_deadline: bool,
        missed: bool,
    ) -> ClaimedMission:
        """A claimed mission as the claim statement returns it."""
        return ClaimedMission(
            id=mission["id"],
            objective=mission["objective"],
            cron=mission["cron"],
            timezone=mission["timezone"],
            scheduled_for=mission["next_run_at"],
            deadline=mission["deadline"],
            agent_id=agent["id"],
            agent_name=agent["name"],
            owner_user_id=agent["owner_user_id"],
            model=agent["model"],
            system_prompt=agent["system_prompt"],
            max_rounds=agent["max_rounds"],
            max_tokens_per_day=agent["max_tokens_per_day"],
            allowed_tools=agent["allowed_tools"],
            policy_mode=agent["policy_mode"],
            user_policy=self.user_policies.get(agent["owner_user_id"], UserPolicySettings()),
            compact_max_ctx=agent["compact_max_ctx"],
            iteration=iteration,
            tokens_used_24h=used,
            past_deadline=past_deadline,
            destructive_policy=agent.get("destructive_policy"),
            claimed_at=now,
            catch_up=CatchUp(mission["catch_up"]),
            catch_up_window=mission["catch_up_window"],
            missed=missed,
        )

    def _awaiting_approval(self, mission_id: int, now: datetime) -> bool:
        return any(
            r["mission_id"] == mission_id and r["status"] == "pending" and r["expires_at"] > now
            for r in self.approvals
        )

    def _start_iteration(
        self, mission: Row, worker_id: str, model: str | None
    ) -> StartedIteration | None:
        """Start the scheduled run's iteration, or take over the one a dead or interrupted
        run left (``attempt`` + 1, its checkpoint kept); ``None`` when it finished."""
        now = self.clock()
        found = next(
            (
                it
                for it in self.iterations.values()
                if it["mission_id"] == mission["id"]
                and it["scheduled_for"] == mission["next_run_at"]
            ),
            None,
        )
        if found is None:
            found = self._new_iteration(mission, worker_id, model, now)
        elif found["status"] in _TAKEN_OVER or (
            found["status"] == "failed" and found["stop_reason"] == "interrupted"
        ):
            self._take_over(found, worker_id, model, now)
        else:
            return None
        return StartedIteration(
            id=found["id"],
            attempt=found["attempt"],
            messages=list(found["messages"]),
            rounds=found["rounds"],
            prompt_tokens=found["prompt_tokens"],
            completion_tokens=found["completion_tokens"],
            reminders=list(found["reminders"]),
        )

    def _new_iteration(self, mission: Row, worker_id: str, model: str | None, now: datetime) -> Row:
        """The first attempt's iteration of the run due."""
        iteration_id = next(self._ids)
        row = self.iterations[iteration_id] = {
            "id": iteration_id,
            "mission_id": mission["id"],
            "scheduled_for": mission["next_run_at"],
            "status": "running",
            "worker_id": worker_id,
            "model": model,
            "attempt": 1,
            "attempts": [{"attempt": 1, "worker_id": worker_id, "started_at": now}],
            "messages": [],
            "reminders": [],
            "rounds": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "stop_reason": None,
            "error": None,
            "started_at": now,
            "finished_at": None,
        }
        return row

    @staticmethod
    def _take_over(found: Row, worker_id: str, model: str | None, now: datetime) -> None:
        """The next attempt at ``found``, from its checkpoint."""
        found["attempt"] += 1
        found["attempts"] = [
            *found["attempts"],
            {
                "attempt": found["attempt"],
                "worker_id": worker_id,
                "started_at": now,
                "resumed_after_round": found["rounds"],
                "resumed_from": found["status"],
            },
        ]
        found |= {
            "status": "running",
            "worker_id": worker_id,
            "model": model,
            "stop_reason": None,
            "error": None,
            "started_at": now,
            "finished_at": None,
        }

    def _tokens_used(self, agent_id: int, mission: Row, since: datetime) -> int:
        """Tokens of the agent's iterations started since ``since``, but the claimed run's."""
        total = 0
        for it in self.iterations.values():
            owner = self.missions[it["mission_id"]]
            if owner["agent_id"] != agent_id or it["started_at"] < since:
                continue
            if it["mission_id"] == mission["id"] and it["scheduled_for"] == mission["next_run_at"]:
                continue
            total += it["prompt_tokens"] + it["completion_tokens"]
        return total

    async def resume_details(self, iteration: StartedIteration) -> StartedIteration:
        """See ``MissionStore.resume_details``."""
        if not iteration.resumable:
            return iteration
        self._enter("resume_details")
        pending = [
            {k: r[k] for k in ("id", "position", "outcome", "result", "error", "policy_decision")}
            for r in self.invocations_of(iteration.id)
            if r["round"] == iteration.rounds
        ]
        turns = [a for a in self.archive if a["iteration_id"] == iteration.id]
        done = [a for a in turns if a["error"] is None]
        latest = max(done, key=lambda a: a["compaction_index"], default=None)
        now = self.clock()
        approvals = []
        for request in self.approvals:
            if request["iteration_id"] != iteration.id or request["consumer"] != "mission":
                continue
            if request["status"] == "pending" and request["expires_at"] <= now:
                request |= {"status": "expired", "decided_at": request["expires_at"]}
            if request["round"] == iteration.rounds:
                approvals.append(
                    {
                        k: request[k]
                        for k in (
                            "id",
                            "position",
                            "status",
                            "tool",
                            "arguments_hash",
                            "decided_by",
                            "decided_at",
                            "decision_note",
                            "target",
                        )
                    }
                )
        return dataclasses.replace(
            iteration,
            pending_rows=pending,
            compaction_attempts=len(turns),
            compactions=len(done),
            last_compaction=(latest["round"], latest["tokens_after"]) if latest else None,
            approvals=sorted(approvals, key=lambda a: a["position"]),
        )

    async def renew_leases(
        self, mission_ids: Collection[int], *, worker_id: str, lease: timedelta
    ) -> set[int]:
        """See ``MissionStore.renew_leases``."""
        self._enter("renew_leases")
        owned = set()
        for mission_id in mission_ids:
            mission = self.missions.get(mission_id)
            if mission is not None and mission["lease_owner"] == worker_id:
                mission["lease_expires_at"] = self.clock() + lease
                owned.add(mission_id)
        return owned

    async def run_effect(
        self,
        mission: ClaimedMission,
        row_id: int,
        effect: Callable[[Any], Awaitable[Any]],
        *,
        worker_id: str,
    ) -> Any:
        """See ``MissionStore.run_effect``; ``effect`` gets no connection (``None``)."""
        self._enter("run_effect")
        row = next((r for r in self.invocations if r["id"] == row_id), None)
        if not self._owns(mission.id, worker_id) or row is None or row["outcome"] != "started":
            raise LeaseLostError(f"mission {mission.id}: lease lost; the call was not run")
        result = await effect(None)
        row |= {"outcome": "ok", "result": result, "error": None}
        return result

    async def record_call_start(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
        reserve: tuple[RateLimit, str, bool] | None = None,
    ) -> CallStart:
        """See ``MissionStore.record_call_start``."""
        self._enter("record_call_start")
        reservation = None
        if reserve is not None:
            limit, consumer, _ = reserve
            reservation = await self.ledger.reserve(
                user_id=mission.owner_user_id, tool=rows[-1].tool, limit=limit, consumer=consumer
            )
        if not self._owns(mission.id, worker_id):
            raise LeaseLostError(f"mission {mission.id}: lease lost; the call was not run")
        may_start = reserve is None or (reservation is not None and reservation.reserved)
        if reserve is not None and reserve[2]:
            may_start = True
        self._checkpoint(iteration_id, checkpoint, mission)
        kept = [r for r in rows if r.outcome != "started" or may_start]
        return CallStart(ids=self._put_rows(mission, iteration_id, kept), reservation=reservation)

    async def commit_round(
        self,
        mission: ClaimedMission,
        iteration_id: int,
        checkpoint: RoundCheckpoint,
        rows: Sequence[ToolInvocationRow],
        *,
        worker_id: str,
    ) -> dict[tuple[int, int], int]:
        """See ``MissionStore.commit_round``."""
        self._enter("commit_round")
        if not self._owns(mission.id, worker_id):
            raise LeaseLostError(f"mission {mission.id}: lease lost; the round was not committed")
        self._checkpoint(iteration_id, checkpoint, mission)
        return self._put_rows(mission, iteration_id, rows)
