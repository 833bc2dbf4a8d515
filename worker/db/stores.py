"""The seam between the worker and PostgreSQL: every query the tick and runner make.

Lease protocol (every replica follows it; see shared/DESIGN.md, "Data"):

* ``claim_due`` picks due, unleased (or lease-expired) active missions with
  ``FOR UPDATE SKIP LOCKED`` and stamps ``lease_owner`` / ``lease_expires_at`` in the same
  statement, so two workers never claim the same mission.
* Every later change (starting the iteration, renewing, finishing, releasing) is conditional on
  ``lease_owner = worker_id``; a worker that lost its lease writes nothing.
* Lease times use the database clock (``now()``), never a worker's, so replicas with skewed
  clocks agree on expiry.

An iteration is keyed by ``(mission_id, scheduled_for)``. A run whose worker died leaves its
row ``running``; a run interrupted at shutdown leaves it ``failed`` / ``interrupted``. Either is
taken over (``attempt`` + 1) by the next worker that claims the mission. Finishing writes the
iteration, its tool invocations and the mission's next run in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Text,
    and_,
    case,
    cast,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from planner.policy import UserPolicySettings
from worker.db.policy import user_settings_from_row
from worker.db.tables import (
    agent_mcp_servers,
    agents,
    mission_iterations,
    missions,
    tool_invocations,
    user_policy_settings,
)
from worker.mcp.config import McpServerConfig

__all__ = [
    "ClaimedMission",
    "IterationOutcome",
    "MissionStore",
    "StartedIteration",
    "ToolInvocationRow",
]


@dataclass(frozen=True)
class ClaimedMission:
    """A mission this worker holds the lease on, with its agent and the owner's policy
    settings (read once, at claim time, for the whole iteration).

    ``scheduled_for`` is the ``next_run_at`` the mission had when claimed (UTC-aware).
    ``policy_mode`` is the agent's override of the daemon's policy mode (``None``: none).
    ``mcp_servers`` are the agent's MCP servers (tool sources), by name, secrets included.
    """

    id: int
    objective: str
    cron: str | None
    timezone: str
    scheduled_for: datetime
    deadline: datetime | None
    agent_id: int
    agent_name: str
    owner_user_id: str
    model: str | None
    system_prompt: str
    max_rounds: int
    max_tokens_per_day: int | None
    allowed_tools: tuple[str, ...] | None
    policy_mode: str | None = None
    user_policy: UserPolicySettings = field(default_factory=UserPolicySettings)
    mcp_servers: tuple[McpServerConfig, ...] = ()


@dataclass(frozen=True)
class StartedIteration:
    """The iteration row a run writes into; ``attempt`` > 1 when it took over a dead run."""

    id: int
    attempt: int


@dataclass(frozen=True)
class ToolInvocationRow:
    """One executed or denied tool call, as stored in ``tool_invocations``."""

    round: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    result: Any
    error: str | None
    outcome: str  # ok | error | denied
    duration_ms: float
    policy_decision: dict[str, Any] | None = None
    policy_mode: str | None = None
    attempt: int = 1


@dataclass(frozen=True)
class IterationOutcome:
    """What a finished run stores.

    Attributes:
        status: ``succeeded`` or ``failed``.
        messages: the stored message log (JSON-compatible list).
        next_run_at: the mission's next run (``None`` = no further run).
        mission_status: ``active`` or ``completed`` (a paused mission stays paused).
        reminders: the reminders sent with the run's requests (``[{"round", "producer",
            "text"}]``), stored apart from the message log.
    """

    status: str
    messages: list[dict[str, Any]]
    rounds: int
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str | None
    error: str | None
    next_run_at: datetime | None
    mission_status: str
    tool_invocations: Sequence[ToolInvocationRow] = field(default_factory=tuple)
    reminders: list[dict[str, Any]] = field(default_factory=list)


class MissionStore:
    """Mission, iteration and tool-invocation queries over one AsyncEngine.

    Every method opens its own short transaction; none holds a connection between calls.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def claim_due(
        self, *, worker_id: str, limit: int, lease: timedelta
    ) -> list[ClaimedMission]:
        """Lease up to ``limit`` due missions (oldest ``next_run_at`` first) for ``lease``.

        Due = ``status = 'active'`` and ``next_run_at <= now()`` and no live lease.
        One round trip. Returns ``[]`` when ``limit`` < 1.
        """
        if limit < 1:
            return []
        now = func.now()
        due = (
            select(missions.c.id)
            .where(
                missions.c.status == "active",
                missions.c.next_run_at <= now,
                or_(missions.c.lease_expires_at.is_(None), missions.c.lease_expires_at < now),
            )
            .order_by(missions.c.next_run_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        ups = user_policy_settings
        owner_policy = (
            select(
                func.jsonb_build_object(
                    "destructive_opt_ins",
                    ups.c.destructive_opt_ins,
                    "rate_limit",
                    ups.c.rate_limit,
                    "tool_rate_limits",
                    ups.c.tool_rate_limits,
                    type_=JSONB,
                )
            )
            .where(ups.c.user_id == agents.c.owner_user_id)
            .correlate(agents)
            .scalar_subquery()
        )
        ams = agent_mcp_servers
        mcp = (
            select(
                func.jsonb_agg(
                    aggregate_order_by(
                        func.jsonb_build_object(
                            "name",
                            ams.c.name,
                            "transport",
                            ams.c.transport,
                            "url",
                            ams.c.url,
                            "command",
                            ams.c.command,
                            "args",
                            ams.c.args,
                            "headers",
                            ams.c.headers,
                            "env",
                            ams.c.env,
                            "required",
                            ams.c.required,
                            type_=JSONB,
                        ),
                        ams.c.name,
                    ),
                    type_=JSONB,
                )
            )
            .where(ams.c.agent_id == agents.c.id)
            .correlate(agents)
            .scalar_subquery()
        )
        stmt = (
            update(missions)
            .where(missions.c.id == due.c.id, agents.c.id == missions.c.agent_id)
            .values(lease_owner=worker_id, lease_expires_at=now + lease, updated_at=now)
            .returning(
                missions.c.id,
                missions.c.objective,
                missions.c.cron,
                missions.c.timezone,
                missions.c.next_run_at,
                missions.c.deadline,
                agents.c.id.label("agent_id"),
                agents.c.name.label("agent_name"),
                agents.c.owner_user_id,
                agents.c.model,
                agents.c.system_prompt,
                agents.c.max_rounds,
                agents.c.max_tokens_per_day,
                agents.c.allowed_tools,
                agents.c.policy_mode,
                owner_policy.label("owner_policy"),
                mcp.label("mcp_servers"),
            )
        )
        async with self.engine.begin() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        claimed = [
            ClaimedMission(
                id=r["id"],
                objective=r["objective"],
                cron=r["cron"],
                timezone=r["timezone"],
                scheduled_for=r["next_run_at"],
                deadline=r["deadline"],
                agent_id=r["agent_id"],
                agent_name=r["agent_name"],
                owner_user_id=r["owner_user_id"],
                model=r["model"],
                system_prompt=r["system_prompt"],
                max_rounds=r["max_rounds"],
                max_tokens_per_day=r["max_tokens_per_day"],
                allowed_tools=tuple(r["allowed_tools"]) if r["allowed_tools"] is not None else None,
                policy_mode=r["policy_mode"],
                user_policy=user_settings_from_row(r["owner_policy"]),
                mcp_servers=tuple(McpServerConfig.from_row(m) for m in r["mcp_servers"] or ()),
            )
            for r in rows
        ]
        return sorted(claimed, key=lambda m: m.scheduled_for)

    async def start_iteration(
        self, mission: ClaimedMission, *, worker_id: str, model: str | None
    ) -> StartedIteration | None:
        """Create (or take over) the iteration row for ``mission.scheduled_for``.

        Returns ``None`` when this worker no longer owns the lease, or when that scheduled
        run already finished (succeeded, or failed for a reason other than an interruption).
        """
        owns_lease = (
            select(missions.c.id)
            .where(
                missions.c.id == mission.id,
                missions.c.lease_owner == worker_id,
                missions.c.lease_expires_at > func.now(),
            )
            .exists()
        )
        values = select(
            cast(literal(mission.id), BigInteger).label("mission_id"),
            cast(literal(mission.scheduled_for), DateTime(timezone=True)).label("scheduled_for"),
            cast(literal("running"), Text).label("status"),
            cast(literal(worker_id), Text).label("worker_id"),
            cast(literal(model), Text).label("model"),
        ).where(owns_lease)
        insert_stmt = pg_insert(mission_iterations).from_select(
            ["mission_id", "scheduled_for", "status", "worker_id", "model"], values
        )
        excluded = insert_stmt.excluded
        stmt = insert_stmt.on_conflict_do_update(
            index_elements=["mission_id", "scheduled_for"],
            set_={
                "status": "running",
                "attempt": mission_iterations.c.attempt + 1,
                "worker_id": excluded.worker_id,
                "model": excluded.model,
                "messages": [],
                "reminders": [],
                "rounds": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "stop_reason": None,
                "error": None,
                "started_at": func.now(),
                "finished_at": None,
            },
            where=or_(
                mission_iterations.c.status == "running",
                and_(
                    mission_iterations.c.status == "failed",
                    mission_iterations.c.stop_reason == "interrupted",
                ),
            ),
        ).returning(mission_iterations.c.id, mission_iterations.c.attempt)
        async with self.engine.begin() as conn:
            row = (await conn.execute(stmt)).first()
        return StartedIteration(id=row.id, attempt=row.attempt) if row else None

    async def tokens_used(self, agent_id: int, *, window: timedelta) -> int:
        """Tokens (prompt + completion) of ``agent_id``'s iterations started within ``window``
        before now (database clock)."""
        stmt = (
            select(
                func.coalesce(
                    func.sum(
                        mission_iterations.c.prompt_tokens + mission_iterations.c.completion_tokens
                    ),
                    0,
                )
            )
            .select_from(
                mission_iterations.join(missions, missions.c.id == mission_iterations.c.mission_id)
            )
            .where(
                missions.c.agent_id == agent_id,
                mission_iterations.c.started_at >= func.now() - window,
            )
        )
        async with self.engine.connect() as conn:
            return int((await conn.execute(stmt)).scalar_one())

    async def renew_lease(self, mission_id: int, *, worker_id: str, lease: timedelta) -> bool:
        """Push the lease ``lease`` past now. False when this worker no longer owns it."""
        stmt = (
            update(missions)
            .where(missions.c.id == mission_id, missions.c.lease_owner == worker_id)
            .values(lease_expires_at=func.now() + lease)
            .returning(missions.c.id)
        )
        async with self.engine.begin() as conn:
            return (await conn.execute(stmt)).first() is not None

    async def finish_iteration(
        self,
        mission: ClaimedMission,
        iteration_id: int | None,
        outcome: IterationOutcome,
        *,
        worker_id: str,
    ) -> bool:
        """Store the run and schedule the next one, in one transaction; release the lease.

        ``iteration_id=None`` only advances the schedule (the run was skipped). Returns False,
        writing nothing, when this worker no longer owns the lease.
        """
        async with self.engine.begin() as conn:
            advanced = await conn.execute(
                update(missions)
                .where(missions.c.id == mission.id, missions.c.lease_owner == worker_id)
                .values(
                    next_run_at=outcome.next_run_at,
                    status=case(
                        (missions.c.status == "paused", "paused"), else_=outcome.mission_status
                    ),
                    last_error=outcome.error,
                    lease_owner=None,
                    lease_expires_at=None,
                    updated_at=func.now(),
                )
                .returning(missions.c.id)
            )
            if advanced.first() is None:
                await conn.rollback()
                return False
            if iteration_id is None:
                return True
            await conn.execute(
                update(mission_iterations)
                .where(mission_iterations.c.id == iteration_id)
                .values(
                    status=outcome.status,
                    messages=outcome.messages,
                    reminders=outcome.reminders,
                    rounds=outcome.rounds,
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.completion_tokens,
                    stop_reason=outcome.stop_reason,
                    error=outcome.error,
                    finished_at=func.now(),
                )
            )
            await _insert_invocations(conn, mission, iteration_id, outcome.tool_invocations)
        return True

    async def interrupt_iteration(
        self,
        mission: ClaimedMission,
        iteration_id: int | None,
        *,
        worker_id: str,
        reason: str,
        messages: list[dict[str, Any]] | None = None,
        invocations: Sequence[ToolInvocationRow] = (),
        reminders: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Mark a run ``failed`` / ``interrupted`` and release the lease without advancing
        the schedule, so the next worker runs that scheduled time again. ``messages``,
        ``invocations`` and ``reminders`` keep what the interrupted attempt did (its tool
        calls happened).
        False when this worker no longer owns the lease (nothing written)."""
        async with self.engine.begin() as conn:
            released = await conn.execute(
                update(missions)
                .where(missions.c.id == mission.id, missions.c.lease_owner == worker_id)
                .values(lease_owner=None, lease_expires_at=None, updated_at=func.now())
                .returning(missions.c.id)
            )
            if released.first() is None:
                await conn.rollback()
                return False
            if iteration_id is not None:
                values: dict[str, Any] = {
                    "status": "failed",
                    "stop_reason": "interrupted",
                    "error": reason,
                    "finished_at": func.now(),
                }
                if messages is not None:
                    values["messages"] = messages
                if reminders is not None:
                    values["reminders"] = reminders
                await conn.execute(
                    update(mission_iterations)
                    .where(mission_iterations.c.id == iteration_id)
                    .values(**values)
                )
                await _insert_invocations(conn, mission, iteration_id, invocations)
        return True


async def _insert_invocations(
    conn: AsyncConnection,
    mission: ClaimedMission,
    iteration_id: int,
    rows: Sequence[ToolInvocationRow],
) -> None:
    if not rows:
        return
    await conn.execute(
        insert(tool_invocations),
        [
            {
                "iteration_id": iteration_id,
                "mission_id": mission.id,
                "user_id": mission.owner_user_id,
                "attempt": row.attempt,
                "round": row.round,
                "call_id": row.call_id,
                "tool": row.tool,
                "arguments": row.arguments,
                "result": null() if row.result is None else row.result,
                "error": row.error,
                "outcome": row.outcome,
                # SQL NULL, not JSON null: "no decision" must read as such in reports
                "policy_decision": null() if row.policy_decision is None else row.policy_decision,
                "policy_mode": row.policy_mode,
                "duration_ms": row.duration_ms,
            }
            for row in rows
        ],
    )
