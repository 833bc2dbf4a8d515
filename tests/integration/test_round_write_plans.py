"""A run's writes reach its calls' stored rows through an index, whatever the size of
``tool_invocations``: PostgreSQL's plan of each run write (``worker.store.writes``) on a
table of thousands of rows from other runs, analysed, never reads the whole table.

Rows travel as ``jsonb_to_recordset``, which the planner costs at 100 rows: joined to the table,
it hashed all of ``tool_invocations`` instead of probing an index, a sequential scan per write
until the table outgrew that estimate (tens of thousands of rows)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.store.writes import ends, progress

CALLS = 5000
"""Rows of other runs in ``tool_invocations``: past what a seq scan costs less than 100 probes
at the planner's estimates, short of where the estimate stops mattering."""


async def _fill(db: AsyncEngine) -> tuple[int, int]:
    """One agent and mission, 50 iterations of 100 calls each, analysed; the mission's id and
    the last iteration's."""
    async with db.begin() as conn:
        agent = (
            await conn.execute(
                text(
                    "INSERT INTO agents (name, owner_user_id, system_prompt) "
                    "VALUES ('plans', 'u1', 'p') RETURNING id"
                )
            )
        ).scalar_one()
        mission = (
            await conn.execute(
                text(
                    "INSERT INTO missions (agent_id, objective, cron, timezone, next_run_at) "
                    "VALUES (:a, 'o', '0 * * * *', 'UTC', now()) RETURNING id"
                ),
                {"a": agent},
            )
        ).scalar_one()
        await conn.execute(
            text(
                "INSERT INTO mission_iterations (mission_id, scheduled_for, status, worker_id) "
                "SELECT :m, now() - make_interval(hours => g), 'succeeded', 'w' "
                "FROM generate_series(1, 50) AS g"
            ),
            {"m": mission},
        )
        await conn.execute(
            text(
                "INSERT INTO tool_invocations (iteration_id, mission_id, user_id, attempt, "
                "round, position, call_id, tool, arguments, outcome) "
                "SELECT i.id, :m, 'u1', 1, g / 10, g % 10, 'c' || g, 'clock_now', '{}', 'ok' "
                "FROM mission_iterations AS i, generate_series(0, :per - 1) AS g"
            ),
            {"m": mission, "per": CALLS // 50},
        )
        iteration = (
            await conn.execute(text("SELECT max(id) FROM mission_iterations"))
        ).scalar_one()
    async with db.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("ANALYZE tool_invocations"))
        await conn.execute(text("ANALYZE mission_iterations"))
    return mission, iteration


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _plan(db: AsyncEngine, stmt: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan nodes PostgreSQL picks for ``stmt`` run as the worker runs it (compiled for
    asyncpg, its parameters processed as SQLAlchemy processes them)."""
    compiled = stmt.compile(dialect=db.dialect)
    arguments = []
    for name in compiled.positiontup:
        bind = compiled.binds[name]
        value = params[name] if name in params else bind.value
        process = bind.type.dialect_impl(db.dialect).bind_processor(db.dialect)
        arguments.append(process(value) if process is not None else value)
    async with db.connect() as conn:
        raw: Any = (await conn.get_raw_connection()).driver_connection
        explained = await raw.fetchval("EXPLAIN (FORMAT JSON) " + compiled.string, *arguments)
    [root] = json.loads(explained) if isinstance(explained, str) else explained
    return list(_nodes(root["Plan"]))


def _reads_of(nodes: list[dict[str, Any]], table: str) -> list[str]:
    return [n["Node Type"] for n in nodes if n.get("Relation Name") == table]


def _call(iteration: int, mission: int, **extra: Any) -> dict[str, Any]:
    return {
        "iteration_id": iteration,
        "mission_id": mission,
        "user_id": "u1",
        "round": 1,
        "position": 0,
        "call_id": "new",
        "tool": "clock_now",
        "arguments": {},
        "idempotency_key": None,
        "attempt": 2,
        "result": "12:00",
        "error": None,
        "outcome": "ok",
        "policy_decision": None,
        "policy_mode": "off",
        "duration_ms": 1.0,
        **extra,
    }


@pytest.mark.parametrize("shape", ["finish with new calls", "checkpoint of stored calls"])
async def test_a_round_write_reads_tool_invocations_through_an_index(
    db: AsyncEngine, shape: str
) -> None:
    mission, iteration = await _fill(db)
    common = {
        "p_mission_id": mission,
        "p_worker_id": "w",
        "p_iteration_id": iteration,
        "p_messages": [],
        "p_reminders": [],
        "p_rounds": 1,
        "p_prompt_tokens": 1,
        "p_completion_tokens": 1,
        "p_new_calls": [],
        "p_known_calls": [],
        "p_archive": [],
    }
    if shape == "finish with new calls":
        stmt = ends.finished()
        params = common | {
            "p_mission_status": "active",
            "p_next_run_at": datetime.now(UTC),
            "p_last_error": None,
            "p_status": "succeeded",
            "p_stop_reason": "final_answer",
            "p_error": None,
            "p_new_calls": [_call(iteration, mission)],
            "p_attempt": 2,
        }
    else:
        stmt = progress.checkpoint()
        async with db.connect() as conn:
            row_id = (
                await conn.execute(
                    text("SELECT max(id) FROM tool_invocations WHERE iteration_id = :i"),
                    {"i": iteration},
                )
            ).scalar_one()
        params = common | {"p_known_calls": [_call(iteration, mission, id=row_id)]}
    reads = _reads_of(await _plan(db, stmt, params), "tool_invocations")
    assert reads, "the plan does not read tool_invocations at all"
    assert "Seq Scan" not in reads, reads
