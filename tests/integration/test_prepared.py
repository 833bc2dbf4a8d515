"""The hot statements on the asyncpg connection (``worker.store.prepared``): what they store and
return is what SQLAlchemy's execution gave, and their errors are SQLAlchemy's."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Integer, Text, bindparam, func, literal, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.worker_harness import add_mission
from worker.store.base import ClaimOrder, IterationOutcome
from worker.store.claim import LITERAL_LIMITS, claim_statement
from worker.store.engine import create_engine, run_statement
from worker.store.postgres import PostgresMissionStore
from worker.store.prepared import PreparedStatement, run_prepared
from worker.store.round_writes import round_write_statement
from worker.store.statuses import IterationStatus, MissionStatus
from worker.store.transient import is_transient


@functools.cache
def echo() -> Any:
    """One statement of each kind of parameter: a JSONB a caller binds, a text, a constant."""
    return select(
        bindparam("p_json", type_=JSONB).label("json"),
        func.upper(bindparam("p_text", type_=Text)).label("upper"),
        literal("it's constant", Text).label("constant"),
        literal(7, Integer).label("seven"),
        (bindparam("p_limit", type_=Integer) + 0).label("limit"),
        literal("active", Text).in_(("active", "paused")).label("listed"),
    )


def test_constants_are_written_as_literals_and_the_callers_parameters_numbered() -> None:
    statement = PreparedStatement(echo(), asyncpg_dialect())
    assert statement.names == ("p_json", "p_text", "p_limit")
    assert "'it''s constant'" in statement.text
    assert "IN ('active', 'paused')" in statement.text
    assert "$1" in statement.text and "$3" in statement.text and "$4" not in statement.text
    assert statement.arguments({"p_json": {"a": [1]}, "p_text": "x", "p_limit": 2}) == [
        '{"a": [1]}',
        "x",
        2,
    ]


@pytest.mark.parametrize(
    "stmt",
    [
        claim_statement(1),
        claim_statement(LITERAL_LIMITS + 1),
        round_write_statement(
            "finish",
            iteration=True,
            checkpoint=True,
            end=True,
            new_calls=True,
            known_calls=True,
            archive=True,
            reserve=True,
            approval=True,
            end_parked=True,
        ),
        round_write_statement(
            "finish",
            iteration=True,
            checkpoint=True,
            end=True,
            new_calls=True,
            known_calls=False,
            archive=False,
            claim=3,
        ),
    ],
    ids=["claim", "large claim", "round write", "finish that claims"],
)
def test_the_hot_statements_compile(stmt: Any) -> None:
    statement = PreparedStatement(stmt, asyncpg_dialect())
    assert all(name.startswith("p_") or name.startswith("param_") for name in statement.names)


async def test_rows_read_as_sqlalchemys_do(db: AsyncEngine) -> None:
    params = {"p_json": {"k": ["v", None, 1.5]}, "p_text": "abc", "p_limit": 3}
    ours = await run_prepared(db, echo(), params)
    theirs = await run_statement(db, echo(), params)
    assert [dict(r) for r in ours] == [dict(r) for r in theirs] != []


async def test_data_the_database_refuses_is_a_dbapi_error_that_is_not_transient(
    db: AsyncEngine,
) -> None:
    with pytest.raises(DBAPIError) as refused:
        await run_prepared(db, echo(), {"p_json": None, "p_text": "x", "p_limit": 2**40})
    assert not is_transient(refused.value)
    assert refused.value.orig is not None


async def test_a_broken_connection_is_dropped_and_the_statement_runs_on_another(
    database_url: str, db: AsyncEngine
) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        [first] = await run_prepared(engine, echo(), {"p_json": 1, "p_text": "a", "p_limit": 1})
        async with engine.connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        async with db.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        [again] = await run_prepared(engine, echo(), {"p_json": 1, "p_text": "b", "p_limit": 1})
        assert (first["upper"], again["upper"]) == ("A", "B")
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != pid
    finally:
        await engine.dispose()


async def test_claims_and_finishes_that_claim_keep_one_generic_plan(
    db: AsyncEngine, database_url: str
) -> None:
    """PostgreSQL plans a prepared statement anew at every run until its generic plan costs
    no more than the plans it made for the values bound; a claim's ``LIMIT`` bound as a
    parameter kept it from ever settling (about 0.7 ms of server CPU per finish that claims)."""
    await add_mission(db, due_in=timedelta(seconds=-1))
    async with db.begin() as conn:  # a backlog the planner knows of
        await conn.execute(
            text(
                "INSERT INTO missions (agent_id, objective, cron, timezone, next_run_at) "
                "SELECT agent_id, objective, cron, timezone, next_run_at FROM missions, "
                "generate_series(1, 2000)"
            )
        )
        await conn.execute(text("ANALYZE missions"))
    engine = create_engine(database_url, pool_size=1, max_overflow=0)  # one connection
    store = PostgresMissionStore(engine)
    lease = timedelta(seconds=60)
    try:
        [mission] = await store.claim_due(worker_id="w1", limit=1, lease=lease)
        for _ in range(8):
            await store.claim_due(worker_id="w1", limit=1, lease=lease)
        for _ in range(8):
            order = ClaimOrder(limit=1, lease=lease)
            assert mission.iteration is not None
            done = IterationOutcome(
                status=IterationStatus.SUCCEEDED,
                messages=[],
                rounds=1,
                prompt_tokens=1,
                completion_tokens=1,
                stop_reason=None,
                error=None,
                next_run_at=None,
                mission_status=MissionStatus.COMPLETED,
            )
            await store.finish_iteration(
                mission, mission.iteration.id, done, worker_id="w1", claim=order
            )
            [mission] = order.claimed
        fairy = await engine.raw_connection()
        try:
            plans = await fairy.driver_connection.fetch(
                "SELECT statement, generic_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'WITH%'"
            )
        finally:
            fairy.close()
    finally:
        await engine.dispose()
    generic = {("finish" if "owned" in s else "claim"): n for s, n in plans}
    assert generic["claim"] >= 1 and generic["finish"] >= 1, generic
