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
import itertools
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from planner.gate import Reservation
from planner.policy import RateLimit, UserPolicySettings
from planner.testing import InMemoryCallLedger
from worker.store.base import LeaseLostError
from worker.store.claim import DEFAULT_CATCH_UP_WINDOW, MISFIRE_GRACE
from worker.store.records import (
    CallStart,
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
    StartedIteration,
    ToolInvocationRow,
)
from worker.store.statuses import CatchUp
from worker.store.writes.parts import DEADLINE_NOTE

__all__ = ["InMemoryMissionStore"]

Row = dict[str, Any]

_TAKEN_OVER = ("running", "awaiting_approval")


@dataclass
class _Fault:
    exc: BaseException
    times: int
    methods: frozenset[str] | None


@dataclass
class InMemoryMissionStore:
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
    """

    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    agents: dict[int, Row] = field(default_factory=dict)
    missions: dict[int, Row] = field(default_factory=dict)
    iterations: dict[int, Row] = field(default_factory=dict)
    invocations: list[Row] = field(default_factory=list)
    archive: list[Row] = field(default_factory=list)
    approvals: list[Row] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    user_policies: dict[str, UserPolicySettings] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._faults: list[_Fault] = []
        self.ledger = InMemoryCallLedger(clock=self.clock)

    # -- set-up and faults (tests) ------------------------------------------------------------

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

    def fail_next(
        self, exc: BaseException, *, times: int = 1, methods: Collection[str] | None = None
    ) -> None:
        """Make the next ``times`` calls of ``methods`` (default: any method) raise ``exc``."""
        self._faults.append(_Fault(exc, times, frozenset(methods) if methods else None))

    def clear_faults(self) -> None:
        """Forget the faults ``fail_next`` asked for."""
        self._faults.clear()

    def get_iteration(self, iteration_id: int) -> Row:
        """One iteration with its ``tool_invocations`` and ``compactions``, in the shape of
        ``AdminStore.get_iteration`` (what replay and rerun read).

        Raises:
            KeyError: no such iteration.
        """
        row = dict(self.iterations[iteration_id])
        archive = sorted(
            (a for a in self.archive if a["iteration_id"] == iteration_id),
            key=lambda a: a["compaction_index"],
        )
        return row | {
            "tool_invocations": [dict(r) for r in self.invocations_of(iteration_id)],
            "compactions": [dict(a) for a in archive],
        }

    def decide(
        self, request_id: int, status: str, *, by: str | None = "tester", note: str | None = None
    ) -> Row:
        """Decide pending approval request ``request_id`` (``approved`` or ``denied``), as
        ``mana-ai approvals approve|deny`` does; the request. Raises KeyError (no such
        request) or ValueError (it was decided already)."""
        row = next(r for r in self.approvals if r["id"] == request_id)
        if row["status"] != "pending":
            raise ValueError(f"approval {request_id} is {row['status']} already")
        row |= {
            "status": status,
            "decided_by": by,
            "decided_at": self.clock(),
            "decision_note": note,
        }
        return row

    def invocations_of(self, iteration_id: int) -> list[Row]:
        """The ``tool_invocations`` rows of one iteration, in insertion order."""
        return [r for r in self.invocations if r["iteration_id"] == iteration_id]

    def _enter(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        for fault in self._faults:
            if fault.times > 0 and (fault.methods is None or method in fault.methods):
                fault.times -= 1
                raise fault.exc

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
        due = sorted(
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
        )[:limit]
        claims = []
        for mission in due:
            mission["lease_owner"] = worker_id
            mission["lease_expires_at"] = now + lease
            agent = self.agents[mission["agent_id"]]
            iteration = None
            past_deadline = mission["deadline"] is not None and now > mission["deadline"]
            window = mission["catch_up_window"] or DEFAULT_CATCH_UP_WINDOW
            missed = (
                (
                    mission["catch_up"] == CatchUp.SKIP
                    and mission["next_run_at"] < now - MISFIRE_GRACE
                )
                or (mission["catch_up"] == CatchUp.ALL and mission["next_run_at"] < now - window)
            ) and not any(
                i["mission_id"] == mission["id"] and i["scheduled_for"] == mission["next_run_at"]
                for i in self.iterations.values()
            )
            if not past_deadline and not missed:
                iteration = self._start_iteration(
                    mission, worker_id, agent["model"] or default_model
                )
            used = None
            if agent["max_tokens_per_day"] is not None:
                used = self._tokens_used(agent["id"], mission, now - budget_window)
            claims.append(
                ClaimedMission(
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
                    user_policy=self.user_policies.get(
                        agent["owner_user_id"], UserPolicySettings()
                    ),
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
            )
        return claims

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
            iteration_id = next(self._ids)
            found = self.iterations[iteration_id] = {
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
        elif found["status"] in _TAKEN_OVER or (
            found["status"] == "failed" and found["stop_reason"] == "interrupted"
        ):
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

    def _end_parked(self, mission_id: int) -> None:
        """The mission's runs parked for approval end (``deadline_passed``), their pending
        requests expire (a finish that moves the mission past them)."""
        for it in self.iterations.values():
            if it["mission_id"] == mission_id and it["status"] == "awaiting_approval":
                it |= {
                    "status": "failed",
                    "stop_reason": "deadline_passed",
                    "error": "the mission's deadline passed while the run waited for an approval",
                    "finished_at": self.clock(),
                }
        for request in self.approvals:
            if request["mission_id"] == mission_id and request["status"] == "pending":
                request |= {
                    "status": "expired",
                    "decided_at": self.clock(),
                    "decision_note": DEADLINE_NOTE,
                }

    # -- the parts every write shares ---------------------------------------------------------

    def _owns(self, mission_id: int, worker_id: str) -> bool:
        mission = self.missions.get(mission_id)
        return mission is not None and mission["lease_owner"] == worker_id

    def _ended(self, iteration_id: int, attempt: int, worker_id: str, status: str) -> bool:
        """A repeat that finds the end it would store, stored by the same attempt."""
        it = self.iterations.get(iteration_id)
        return (
            it is not None
            and it["attempt"] == attempt
            and it["worker_id"] == worker_id
            and it["status"] == status
            and it["finished_at"] is not None
        )

    def _checkpoint(
        self, iteration_id: int, checkpoint: RoundCheckpoint, mission: ClaimedMission
    ) -> None:
        self.iterations[iteration_id] |= {
            "messages": list(checkpoint.messages),
            "reminders": list(checkpoint.reminders),
            "rounds": checkpoint.rounds,
            "prompt_tokens": checkpoint.prompt_tokens,
            "completion_tokens": checkpoint.completion_tokens,
        }
        stored = {a["compaction_index"] for a in self.archive if a["iteration_id"] == iteration_id}
        for row in checkpoint.archive:
            if row.compaction_index in stored:
                continue
            self.archive.append(
                dataclasses.asdict(row)
                | {"id": next(self._ids), "iteration_id": iteration_id, "mission_id": mission.id}
            )

    def _put_rows(
        self, mission: ClaimedMission, iteration_id: int, rows: Sequence[ToolInvocationRow]
    ) -> dict[tuple[int, int], int]:
        """Insert the new rows (unless one of the same attempt, round and position exists)
        and bring the known ones up to date; the new rows' ids by ``(round, position)``."""
        by_id = {r["id"]: r for r in self.invocations}
        ids: dict[tuple[int, int], int] = {}
        for row in rows:
            values = {
                "result": row.result,
                "error": row.error,
                "outcome": row.outcome,
                "policy_decision": row.policy_decision,
                "policy_mode": row.policy_mode,
                "duration_ms": row.duration_ms,
            }
            if row.row_id is not None:
                if row.row_id in by_id:
                    stored = by_id[row.row_id]
                    if stored["outcome"] == "parked":  # it belongs to the attempt starting it
                        stored["attempt"] = row.attempt
                    stored |= values
                continue
            same = next(
                (
                    r
                    for r in self.invocations
                    if r["iteration_id"] == iteration_id
                    and r["attempt"] == row.attempt
                    and r["round"] == row.round
                    and r["position"] == row.position
                ),
                None,
            )
            if same is None:
                same = {
                    "id": next(self._ids),
                    "iteration_id": iteration_id,
                    "mission_id": mission.id,
                    "user_id": mission.owner_user_id,
                    "consumer": "mission",
                    "attempt": row.attempt,
                    "round": row.round,
                    "position": row.position,
                    "call_id": row.call_id,
                    "tool": row.tool,
                    "arguments": row.arguments,
                    "idempotency_key": row.idempotency_key,
                    "created_at": self.clock(),
                    **values,
                }
                self.invocations.append(same)
            ids[(row.round, row.position)] = same["id"]
        return ids
