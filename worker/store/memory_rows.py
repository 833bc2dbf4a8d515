"""The in-memory store's rows and the parts every write to them shares: the base of
``worker.store.memory.InMemoryMissionStore`` (its doc says what the rows are), with the
faults a test asks for (``fail_next``)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from planner.policy import UserPolicySettings
from planner.testing import InMemoryCallLedger
from worker.store.records import ClaimedMission, RoundCheckpoint, ToolInvocationRow
from worker.store.writes.parts import DEADLINE_NOTE

__all__ = ["MemoryTables", "Row"]

Row = dict[str, Any]


@dataclass
class _Fault:
    exc: BaseException
    times: int
    methods: frozenset[str] | None


@dataclass
class MemoryTables:
    """The rows of an in-memory store (``InMemoryMissionStore`` documents them), its faults
    and the parts every write shares."""

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
        """The claim (``InMemoryMissionStore`` makes it)."""
        raise NotImplementedError

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
