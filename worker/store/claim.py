"""The claim: one statement that leases the due missions, starts (or takes over) their
iterations and reads what their runs need (the agent, the owner's policy settings, the agent's
MCP servers and token use), built once (``claim_statement``); and the ``ClaimedMission`` of
each row it returns (``claimed_mission``).

Due = ``status = 'active'`` and ``next_run_at <= now()`` and no live lease, and no pending
approval request that has not expired (a run parked for a person's decision waits for it)
unless the mission's deadline passed (the claim then completes it and ends the parked run),
oldest first, picked with ``FOR UPDATE SKIP LOCKED`` so that replicas never claim the same
mission. No iteration is started when the mission's deadline has passed (no run starts after
it), or for a scheduled run that finished already; a run parked for approval is taken over
like an interrupted one once its request was decided or expired.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Interval,
    Text,
    and_,
    bindparam,
    case,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert

from worker.db.statuses import CatchUp
from worker.db.tables import (
    agent_mcp_servers,
    agents,
    approval_requests,
    mission_iterations,
    missions,
    user_policy_settings,
)
from worker.store.agent_servers import McpServerConfig
from worker.store.records import ClaimedMission, StartedIteration, user_settings_from_row
from worker.store.writes.parts import constant

__all__ = [
    "DEFAULT_CATCH_UP_WINDOW",
    "LITERAL_LIMITS",
    "MISFIRE_GRACE",
    "claim_limit",
    "claim_parameters",
    "claim_select",
    "claim_statement",
    "claimed_mission",
]


def claim_parameters(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    default_model: str | None,
    budget_window: timedelta,
) -> dict[str, Any]:
    """The bind parameters of a claim of up to ``limit`` missions (``claim_statement``, and
    the claim part of a finish: ``claim_select``)."""
    return {
        "p_worker_id": worker_id,
        "p_claim_limit": limit,
        "p_lease": lease,
        "p_default_model": default_model,
        "p_budget_window": budget_window,
    }


LITERAL_LIMITS = 32
"""Claims of up to this many missions have their ``LIMIT`` written in the statement, one
statement per limit; larger ones bind it (``p_claim_limit``). PostgreSQL judges a prepared
statement's generic plan against the plans it made for the values bound: with the limit
bound, a claim's generic plan is costed for an unknown limit and never chosen, so every claim
(and every finish that claims) was planned anew, about 0.7 ms of server CPU for the finish
that claims (``bench/db_floor.py``); with the limit written, the generic plan is the same and
is kept after five runs. A large claim is rare and serves many missions."""


def claim_statement(limit: int) -> Any:
    """``claim_due``'s statement for ``limit`` missions, built once per limit up to
    ``LITERAL_LIMITS`` (then once); bind parameters ``claim_parameters``."""
    return claim_select(limit=claim_limit(limit))


def claim_limit(limit: int) -> int | None:
    """The ``limit`` a claim of ``limit`` missions writes in its statement; ``None``: bound."""
    return limit if limit <= LITERAL_LIMITS else None


@functools.cache
def claim_select(
    *, after_finish: bool = False, finished_tokens: bool = False, limit: int | None = None
) -> Any:
    """The claim as a SELECT of one row per claimed mission (``claimed_mission`` reads one),
    built once per shape; bind parameters ``claim_parameters`` (without ``p_claim_limit``
    when ``limit`` is written in it: see ``LITERAL_LIMITS``).

    With ``after_finish``, it is the part of a finish that claims (``worker.store.writes.ends``
    with ``claim``), which sees the database as it was before the statement, so it makes up
    for what the finish changes: the mission being finished (``p_mission_id``) is never among
    the due ones, whatever its lease says; and with ``finished_tokens``, the finished
    iteration (``p_iteration_id``) counts toward its agent's daily budget with the tokens
    the finish stores (``p_prompt_tokens`` + ``p_completion_tokens``) when the finish's lease
    held, else with those on its row (as a claim after the finish would count them).
    """
    now = func.now()
    worker_id = bindparam("p_worker_id", type_=Text)
    lease = bindparam("p_lease", type_=Interval)
    due = _due(now, after_finish=after_finish, limit=limit)
    claimed = (
        update(missions)
        .where(missions.c.id == due.c.id, agents.c.id == missions.c.agent_id)
        .values(lease_owner=worker_id, lease_expires_at=now + lease, updated_at=now)
        .returning(*_claimed_columns(now, finished_tokens=finished_tokens))
        .cte("claimed")
    )
    first_attempt = func.jsonb_build_array(
        func.jsonb_build_object(
            constant("attempt"),
            constant(1),
            constant("worker_id"),
            worker_id,
            constant("started_at"),
            now,
        )
    )
    values = select(
        claimed.c.id,
        claimed.c.next_run_at,
        constant("running"),
        worker_id,
        func.coalesce(claimed.c.model, bindparam("p_default_model", type_=Text)),
        first_attempt,
    ).where(~claimed.c.past_deadline, ~claimed.c.missed)
    started = _start_iteration_statement(values).cte("started")
    return select(
        claimed,
        started.c.id.label("iteration_id"),
        started.c.attempt,
        started.c.messages,
        started.c.rounds,
        started.c.prompt_tokens,
        started.c.completion_tokens,
        started.c.reminders,
    ).select_from(claimed.outerjoin(started, started.c.mission_id == claimed.c.id))


def _due(now: Any, *, after_finish: bool, limit: int | None) -> Any:
    """The ``due`` CTE: the ids of the missions to lease, the longest due first, locked."""
    others = []
    if after_finish:
        others.append(missions.c.id != bindparam("p_mission_id", type_=BigInteger))
    return (
        select(missions.c.id)
        .where(
            *others,
            missions.c.status == constant("active"),
            missions.c.next_run_at <= now,
            or_(missions.c.lease_expires_at.is_(None), missions.c.lease_expires_at < now),
            # a run parked for approval waits for the decision, unless the deadline passed:
            # then the claim ends it (past_deadline) and expires its request
            or_(
                and_(missions.c.deadline.is_not(None), now > missions.c.deadline),
                ~_awaiting_approval(now),
            ),
        )
        .order_by(missions.c.next_run_at)
        .limit(constant(limit) if limit is not None else bindparam("p_claim_limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("due")
    )


def _claimed_columns(now: Any, *, finished_tokens: bool) -> list[Any]:
    """What the claim returns of each leased mission: its row, its agent's, the owner's
    policy, the agent's MCP servers, the budget used, and the deadline and catch-up rules."""
    return [
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
        agents.c.destructive_policy,
        agents.c.compact_max_ctx,
        _owner_policy().label("owner_policy"),
        _mcp_servers().label("mcp_servers"),
        _budget_used(
            bindparam("p_budget_window", type_=Interval), finished_tokens=finished_tokens
        ).label("tokens_used_24h"),
        # the deadline rule, here only: no run starts after the deadline (a run claimed
        # late, after a backlog or a resume, included; next_run_at <= now() here)
        and_(missions.c.deadline.is_not(None), now > missions.c.deadline).label("past_deadline"),
        missions.c.catch_up,
        missions.c.catch_up_window,
        _missed_and_dropped(now).label("missed"),
        # the database's clock: what decides what is due decides when it runs next
        now.label("claimed_at"),
    ]


def claimed_mission(r: Mapping[Any, Any]) -> ClaimedMission:
    """The ClaimedMission of one row of ``claim_statement``."""
    iteration = None
    if r["iteration_id"] is not None:
        iteration = _started(r, r["iteration_id"])
    return ClaimedMission(
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
        compact_max_ctx=r["compact_max_ctx"],
        mcp_servers=tuple(McpServerConfig.from_row(m) for m in r["mcp_servers"] or ()),
        iteration=iteration,
        tokens_used_24h=int(r["tokens_used_24h"]) if r["tokens_used_24h"] is not None else None,
        past_deadline=bool(r["past_deadline"]),
        destructive_policy=r["destructive_policy"],
        claimed_at=r["claimed_at"],
        catch_up=CatchUp(r["catch_up"]),
        catch_up_window=r["catch_up_window"],
        missed=bool(r["missed"]),
    )


def _started(row: Mapping[Any, Any], iteration_id: int) -> StartedIteration:
    """The StartedIteration of an iteration row returned by ``_start_iteration_statement``."""
    return StartedIteration(
        id=iteration_id,
        attempt=row["attempt"],
        messages=list(row["messages"]),
        rounds=row["rounds"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        reminders=list(row["reminders"]),
    )


MISFIRE_GRACE = timedelta(minutes=1)
"""A run that starts more than this after its time is a missed run (``CatchUp``)."""

DEFAULT_CATCH_UP_WINDOW = timedelta(days=1)
"""How far back a ``catch_up=all`` mission's missed runs still run when it sets no window."""


def _missed_and_dropped(now: Any) -> Any:
    """The claimed run is a missed one its mission's catch-up policy drops (``CatchUp``): of a
    ``skip`` mission, due more than ``MISFIRE_GRACE`` ago; of an ``all`` mission, due before
    its window; and no attempt at it began (a run parked for approval, or interrupted, goes on
    however late). No iteration is started: the runner only moves the schedule on
    (correlated to ``missions``)."""
    its = mission_iterations
    begun = (
        select(its.c.id)
        .where(its.c.mission_id == missions.c.id, its.c.scheduled_for == missions.c.next_run_at)
        .correlate(missions)
        .exists()
    )
    window = func.coalesce(missions.c.catch_up_window, constant(DEFAULT_CATCH_UP_WINDOW))
    return and_(
        or_(
            and_(
                missions.c.catch_up == constant(CatchUp.SKIP.value),
                missions.c.next_run_at < now - constant(MISFIRE_GRACE),
            ),
            and_(
                missions.c.catch_up == constant(CatchUp.ALL.value),
                missions.c.next_run_at < now - window,
            ),
        ),
        ~begun,
    )


def _awaiting_approval(now: Any) -> Any:
    """The mission has a pending approval request that has not expired: its parked run waits
    for a person (correlated to ``missions``; the partial index on pending requests' mission
    makes it one index probe)."""
    requests = approval_requests
    return (
        select(requests.c.id)
        .where(
            requests.c.mission_id == missions.c.id,
            requests.c.status == constant("pending"),
            requests.c.expires_at > now,
        )
        .correlate(missions)
        .exists()
    )


def _owner_policy() -> Any:
    """The claimed mission's owner's policy settings as one JSONB object (correlated to
    ``agents``)."""
    ups = user_policy_settings
    return (
        select(
            func.jsonb_build_object(
                constant("destructive_opt_ins"),
                ups.c.destructive_opt_ins,
                constant("rate_limit"),
                ups.c.rate_limit,
                constant("tool_rate_limits"),
                ups.c.tool_rate_limits,
                type_=JSONB,
            )
        )
        .where(ups.c.user_id == agents.c.owner_user_id)
        .correlate(agents)
        .scalar_subquery()
    )


def _mcp_servers() -> Any:
    """The claimed mission's agent's MCP servers as a JSONB array ordered by name."""
    ams = agent_mcp_servers
    return (
        select(
            func.jsonb_agg(
                aggregate_order_by(
                    func.jsonb_build_object(
                        constant("name"),
                        ams.c.name,
                        constant("transport"),
                        ams.c.transport,
                        constant("url"),
                        ams.c.url,
                        constant("command"),
                        ams.c.command,
                        constant("args"),
                        ams.c.args,
                        constant("headers"),
                        ams.c.headers,
                        constant("env"),
                        ams.c.env,
                        constant("required"),
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


def _budget_used(window: Any, *, finished_tokens: bool = False) -> Any:
    """Tokens of the claimed mission's agent's iterations started within ``window``, except
    the claimed run's own iteration (a takeover adds its checkpoint's tokens itself); NULL
    when the agent has no daily budget (the sum is then never computed). With
    ``finished_tokens`` (see ``claim_select``), the finished iteration with the tokens its
    finish stores."""
    its = mission_iterations.alias("budget_iterations")
    owned = missions.alias("budget_missions")
    conditions = [
        owned.c.agent_id == agents.c.id,
        its.c.started_at >= func.now() - window,
        or_(its.c.mission_id != missions.c.id, its.c.scheduled_for != missions.c.next_run_at),
    ]
    iteration_id = bindparam("p_iteration_id", type_=BigInteger)
    if finished_tokens:
        conditions.append(its.c.id != iteration_id)
    used: Any = (
        select(func.coalesce(func.sum(its.c.prompt_tokens + its.c.completion_tokens), constant(0)))
        .select_from(its.join(owned, owned.c.id == its.c.mission_id))
        .where(*conditions)
        .correlate(agents, missions)
        .scalar_subquery()
    )
    if finished_tokens:
        # the finished iteration, in place of its row: with the tokens its finish stores when
        # the lease held (the finish then wrote them), else with those on its row
        ended = mission_iterations.alias("finished_iteration")
        ended_mission = missions.alias("finished_mission")
        written = bindparam("p_prompt_tokens", type_=BigInteger) + bindparam(
            "p_completion_tokens", type_=BigInteger
        )
        finished = (
            select(
                case(
                    (ended_mission.c.lease_owner == bindparam("p_worker_id", type_=Text), written),
                    else_=ended.c.prompt_tokens + ended.c.completion_tokens,
                )
            )
            .select_from(ended.join(ended_mission, ended_mission.c.id == ended.c.mission_id))
            .where(
                ended.c.id == iteration_id,
                ended_mission.c.agent_id == agents.c.id,
                ended.c.started_at >= func.now() - window,
            )
            .correlate(agents)
            .scalar_subquery()
        )
        used = used + func.coalesce(finished, constant(0))
    return case((agents.c.max_tokens_per_day.is_(None), null()), else_=used)


def _start_iteration_statement(values: Any) -> Any:
    """INSERT the iteration rows ``values`` selects (mission_id, scheduled_for, status,
    worker_id, model, attempts), or take over an existing one for the same scheduled run
    when it is ``running`` (its worker died), ``failed`` / ``interrupted``, or
    ``awaiting_approval`` (its request was decided or expired: the claim's due condition
    waits for that), keeping the checkpoint the earlier attempts stored; RETURNING the row. A
    finished run returns nothing."""
    insert_stmt = pg_insert(mission_iterations).from_select(
        ["mission_id", "scheduled_for", "status", "worker_id", "model", "attempts"], values
    )
    excluded = insert_stmt.excluded
    iterations = mission_iterations.c
    takeover = func.jsonb_build_object(
        constant("attempt"),
        iterations.attempt + constant(1),
        constant("worker_id"),
        excluded.worker_id,
        constant("started_at"),
        func.now(),
        constant("resumed_after_round"),
        iterations.rounds,
        constant("resumed_from"),
        iterations.status,
    )
    return insert_stmt.on_conflict_do_update(
        index_elements=["mission_id", "scheduled_for"],
        set_={
            "status": constant("running"),
            "attempt": iterations.attempt + constant(1),
            "worker_id": excluded.worker_id,
            "model": excluded.model,
            "attempts": iterations.attempts.op("||")(func.jsonb_build_array(takeover)),
            "stop_reason": constant(None),
            "error": constant(None),
            "started_at": func.now(),
            "finished_at": constant(None),
        },
        where=or_(
            iterations.status.in_([constant("running"), constant("awaiting_approval")]),
            and_(
                iterations.status == constant("failed"),
                iterations.stop_reason == constant("interrupted"),
            ),
        ),
    ).returning(
        iterations.id,
        iterations.mission_id,
        iterations.attempt,
        iterations.messages,
        iterations.rounds,
        iterations.prompt_tokens,
        iterations.completion_tokens,
        iterations.reminders,
    )
