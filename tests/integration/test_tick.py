"""The tick and the runner against real PostgreSQL: claims, leases, iterations, schedules.

The LLM is the scripted fake in-process, or the fake OpenAI-compatible server over real HTTP.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import (
    CompletionRequest,
    CompletionResponse,
    TokenUsage,
    ToolContext,
    ToolSpec,
)
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.fakes.llm_server import FakeLLMServer, chat_completion_body, down_base_url
from tests.integration.worker_harness import (
    LEASE,
    add_mission,
    clock_then_answer,
    iterations,
    make_worker,
    mission_row,
)
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.tables import missions, tool_invocations
from worker.llm import OpenAICompatibleChatModel
from worker.queries.missions import AdminStore
from worker.store.postgres import PostgresMissionStore


async def test_due_mission_runs_and_is_stored_with_its_tool_calls(db: AsyncEngine) -> None:
    mission_id = await add_mission(db)
    worker = make_worker(db, FunctionChatModel(clock_then_answer))

    assert await worker.run_once() == ["succeeded"]

    [it] = await iterations(db)
    assert it["mission_id"] == mission_id and it["status"] == "succeeded"
    assert it["stop_reason"] == "final_answer" and it["rounds"] == 2
    assert it["prompt_tokens"] == 20 and it["completion_tokens"] == 10
    assert [m["role"] for m in it["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    async with db.connect() as conn:
        [call] = (await conn.execute(select(tool_invocations))).mappings().all()
    assert call["tool"] == "clock_now" and call["outcome"] == "ok" and call["user_id"] == "u1"
    mission = await mission_row(db, mission_id)
    assert mission["lease_owner"] is None and mission["status"] == "active"
    assert mission["next_run_at"] > datetime.now(UTC)
    assert mission["next_run_at"].minute == 0  # the next hour, per "0 * * * *"
    # nothing else is due: a second tick runs nothing
    assert await worker.run_once() == []


async def test_missions_not_yet_due_or_paused_are_left_alone(db: AsyncEngine) -> None:
    await add_mission(db, due_in=timedelta(hours=1))
    paused = await add_mission(db)
    await AdminStore(db).pause_mission(paused)
    assert await make_worker(db, FunctionChatModel(clock_then_answer)).run_once() == []


async def test_one_shot_mission_completes_after_its_run(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=None)
    assert await make_worker(db, FunctionChatModel(clock_then_answer)).run_once() == ["succeeded"]
    mission = await mission_row(db, mission_id)
    assert mission["status"] == "completed" and mission["next_run_at"] is None


async def test_endpoint_answering_500_twice_then_200_gives_a_succeeded_iteration(
    db: AsyncEngine,
) -> None:
    with FakeLLMServer() as server:
        server.enqueue(status=500, json={"error": {"message": "overloaded"}})
        server.enqueue(status=500, json={"error": {"message": "overloaded"}})
        server.enqueue(json=chat_completion_body(content="All good."))
        llm = OpenAICompatibleChatModel(
            base_url=server.base_url, max_retries=3, backoff_initial_s=0.01, backoff_max_s=0.05
        )
        await add_mission(db)
        async with llm:
            assert await make_worker(db, llm).run_once() == ["succeeded"]
        assert len(server.requests) == 3
    [it] = await iterations(db)
    assert it["status"] == "succeeded" and it["messages"][-1]["content"] == "All good."


async def test_endpoint_down_fails_the_iteration_keeps_the_schedule_and_the_next_tick_runs(
    db: AsyncEngine,
) -> None:
    down = OpenAICompatibleChatModel(
        base_url=down_base_url(), max_retries=1, backoff_initial_s=0.01, backoff_max_s=0.02
    )
    first = await add_mission(db)
    async with down:
        assert await make_worker(db, down).run_once() == ["failed"]
    [it] = await iterations(db)
    assert it["status"] == "failed" and it["stop_reason"] == "llm_error"
    assert "could not reach" in it["error"] and "127.0.0.1" in it["error"]
    mission = await mission_row(db, first)
    assert mission["status"] == "active" and mission["next_run_at"] > datetime.now(UTC)
    assert mission["last_error"] == it["error"]

    second = await add_mission(db, agent="a2")
    assert await make_worker(db, FunctionChatModel(clock_then_answer)).run_once() == ["succeeded"]
    assert [i["mission_id"] for i in await iterations(db)] == [first, second]


async def test_garbage_from_the_llm_is_a_failed_iteration_with_the_reason(db: AsyncEngine) -> None:
    with FakeLLMServer() as server:
        server.enqueue_text("<html>502 bad gateway</html>", status=200)
        llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
        await add_mission(db)
        async with llm:
            assert await make_worker(db, llm).run_once() == ["failed"]
    [it] = await iterations(db)
    assert it["status"] == "failed" and "bad gateway" in it["error"]


async def test_a_raising_tool_is_an_error_result_not_a_failed_run(db: AsyncEngine) -> None:
    async def explode(args: dict[str, Any], ctx: ToolContext) -> None:
        raise OSError("disk full")

    boom = ToolSpec("boom", "Fails.", {"type": "object"}, "write", explode)

    def script(request: CompletionRequest) -> CompletionResponse:
        if any(m.role == "tool" for m in request.messages):
            return final_answer("The tool failed; stopping.")
        return tool_calls(("boom", {}))

    await add_mission(db)
    worker = make_worker(db, FunctionChatModel(script), extra_tools=[boom])
    assert await worker.run_once() == ["succeeded"]
    async with db.connect() as conn:
        [call] = (await conn.execute(select(tool_invocations))).mappings().all()
    assert call["outcome"] == "error" and call["error"] == "boom failed: disk full"


async def test_two_workers_on_one_database_run_50_missions_exactly_once(
    db: AsyncEngine, database_url: str
) -> None:
    ids = [await add_mission(db, agent=f"agent-{i % 5}") for i in range(50)]

    async def slow_answer(request: CompletionRequest) -> CompletionResponse:
        await asyncio.sleep(0)  # yield so the two workers interleave
        return clock_then_answer(request)

    # the second worker has its own engine (own pool), as a second replica would
    other_engine = create_engine(database_url)
    workers = [
        make_worker(engine, FunctionChatModel(slow_answer), worker_id=f"w{n}", max_concurrent=4)
        for n, engine in ((1, db), (2, other_engine))
    ]

    async def drain(worker: Worker) -> list[str]:
        outcomes: list[str] = []
        while batch := await worker.run_once():
            outcomes += batch
        return outcomes

    try:
        first, second = await asyncio.gather(drain(workers[0]), drain(workers[1]))
    finally:
        await other_engine.dispose()
    # exactly once: every mission ran, none twice, each run stored once under the worker
    # that reported it. How the 50 split between the two is the scheduler's business (on a
    # loaded machine one worker may claim them all), so it is not asserted.
    assert first + second == ["succeeded"] * 50
    stored = await iterations(db)
    assert sorted(i["mission_id"] for i in stored) == sorted(ids)
    assert all(i["status"] == "succeeded" and i["attempt"] == 1 for i in stored)
    by_worker = [i["worker_id"] for i in stored]
    assert (by_worker.count("w1"), by_worker.count("w2")) == (len(first), len(second))
    async with db.connect() as conn:
        calls = (await conn.execute(select(tool_invocations.c.iteration_id))).scalars().all()
    assert sorted(calls) == sorted(i["id"] for i in stored), "one clock_now call per run"


async def test_expired_lease_of_a_dead_worker_is_taken_over(db: AsyncEngine) -> None:
    mission_id = await add_mission(db)
    store = PostgresMissionStore(db)
    # worker "dead" claims the mission (which starts the iteration), then vanishes
    [claimed] = await store.claim_due(worker_id="dead", limit=1, lease=timedelta(seconds=30))
    started = claimed.iteration
    assert started is not None and started.attempt == 1
    [it] = await iterations(db)
    assert it["status"] == "running" and it["worker_id"] == "dead"
    alive = make_worker(db, FunctionChatModel(clock_then_answer), worker_id="alive")
    assert await alive.run_once() == [], "a live lease must not be claimed"

    await _expire_lease(db, mission_id)
    assert await alive.run_once() == ["succeeded"]
    [it] = await iterations(db)
    assert it["id"] == started.id and it["attempt"] == 2
    assert it["worker_id"] == "alive" and it["status"] == "succeeded"


async def test_a_worker_that_lost_its_lease_writes_nothing(db: AsyncEngine) -> None:
    mission_id = await add_mission(db)
    taken_over = asyncio.Event()

    async def slow(request: CompletionRequest) -> CompletionResponse:
        # meanwhile another worker takes the mission over
        await _expire_lease(db, mission_id)
        [claimed] = await PostgresMissionStore(db).claim_due(
            worker_id="thief", limit=1, lease=LEASE
        )
        assert claimed.id == mission_id
        taken_over.set()
        return final_answer("done")

    worker = make_worker(db, FunctionChatModel(slow), worker_id="victim")
    assert await worker.run_once() == ["lease_lost"]
    assert taken_over.is_set()
    [it] = await iterations(db)
    assert it["status"] == "running"  # the victim did not store its result
    mission = await mission_row(db, mission_id)
    assert mission["lease_owner"] == "thief"


async def test_drain_interrupts_a_hung_run_and_the_next_worker_resumes_it(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db)
    entered = asyncio.Event()

    async def call_a_tool_then_hang(request: CompletionRequest) -> CompletionResponse:
        if not any(m.role == "tool" for m in request.messages):
            return tool_calls(("clock_now", {}))
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    worker = make_worker(db, FunctionChatModel(call_a_tool_then_hang), worker_id="leaving")
    [task] = await worker.tick()
    await entered.wait()
    await worker.drain(grace_s=0.05)
    assert task.cancelled()
    [it] = await iterations(db)
    assert it["status"] == "failed" and it["stop_reason"] == "interrupted"
    assert "leaving" in it["error"]
    # what the interrupted attempt did is kept: its log so far and its tool call
    assert [m["role"] for m in it["messages"]] == ["system", "user", "assistant", "tool"]
    assert (await mission_row(db, mission_id))["lease_owner"] is None
    assert await worker.run_once() == [], "a draining worker claims nothing"

    successor = make_worker(db, FunctionChatModel(clock_then_answer), worker_id="next")
    assert await successor.run_once() == ["succeeded"]
    [it] = await iterations(db)
    assert it["status"] == "succeeded" and it["attempt"] == 2
    # the successor went on after round 1 instead of starting over: one call, one log
    assert it["rounds"] == 2 and [m["role"] for m in it["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [(a["attempt"], a["worker_id"]) for a in it["attempts"]] == [(1, "leaving"), (2, "next")]
    assert it["attempts"][1]["resumed_after_round"] == 1
    async with db.connect() as conn:
        calls = (await conn.execute(select(tool_invocations))).mappings().all()
    assert [(c["attempt"], c["tool"]) for c in calls] == [(1, "clock_now")]


async def test_a_mission_paused_while_running_stays_paused(db: AsyncEngine) -> None:
    mission_id = await add_mission(db)

    async def pause_meanwhile(request: CompletionRequest) -> CompletionResponse:
        await AdminStore(db).pause_mission(mission_id)
        return final_answer("done")

    assert await make_worker(db, FunctionChatModel(pause_meanwhile)).run_once() == ["succeeded"]
    assert (await mission_row(db, mission_id))["status"] == "paused"


async def test_a_run_due_past_the_deadline_completes_the_mission_without_an_iteration(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db)  # due now
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(deadline=datetime.now(UTC) - timedelta(minutes=1))
        )
    llm = FunctionChatModel(clock_then_answer)
    assert await make_worker(db, llm).run_once() == ["skipped"]
    assert llm.requests == [] and await iterations(db) == []
    mission = await mission_row(db, mission_id)
    assert mission["status"] == "completed" and mission["lease_owner"] is None


async def test_a_run_claimed_after_the_deadline_does_not_start_though_due_before_it(
    db: AsyncEngine,
) -> None:
    # due 2 min ago, deadline 1 min ago: the worker was down, or the mission was resumed
    mission_id = await add_mission(db, due_in=timedelta(minutes=-2))
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(deadline=datetime.now(UTC) - timedelta(minutes=1))
        )
    llm = FunctionChatModel(clock_then_answer)
    assert await make_worker(db, llm).run_once() == ["skipped"]
    assert llm.requests == [] and await iterations(db) == []
    assert (await mission_row(db, mission_id))["status"] == "completed"


async def test_a_cron_whose_next_time_is_past_the_deadline_completes_after_its_run(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db, cron="0 0 1 1 *")  # yearly, due now
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(deadline=datetime.now(UTC) + timedelta(minutes=5))
        )
    assert await make_worker(db, FunctionChatModel(clock_then_answer)).run_once() == ["succeeded"]
    mission = await mission_row(db, mission_id)
    assert mission["status"] == "completed" and mission["next_run_at"] is None


async def test_a_broken_stored_cron_pauses_the_mission_with_the_reason(db: AsyncEngine) -> None:
    mission_id = await add_mission(db)
    async with db.begin() as conn:
        await conn.execute(update(missions).where(missions.c.id == mission_id).values(cron="bad"))
    assert await make_worker(db, FunctionChatModel(clock_then_answer)).run_once() == ["succeeded"]
    mission = await mission_row(db, mission_id)
    assert (
        mission["status"] == "paused" and "invalid cron expression 'bad'" in mission["last_error"]
    )


async def test_concurrency_cap_limits_missions_per_tick(db: AsyncEngine) -> None:
    for i in range(5):
        await add_mission(db, agent=f"cap-{i}")
    worker = make_worker(db, FunctionChatModel(clock_then_answer), max_concurrent=2)
    assert len(await worker.run_once()) == 2
    assert len(await worker.run_once()) == 2
    assert len(await worker.run_once()) == 1


async def _expire_lease(engine: AsyncEngine, mission_id: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE missions SET lease_expires_at = now() - interval '1 second' WHERE id = :id"
            ),
            {"id": mission_id},
        )


async def test_a_crash_in_the_run_is_a_failed_iteration_and_the_schedule_advances(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db)

    def broken_tools(mission: object) -> list[ToolSpec]:
        raise RuntimeError("tool source unavailable")

    worker = make_worker(db, FunctionChatModel(clock_then_answer), tools_for=broken_tools)
    assert await worker.run_once() == ["failed"]
    [it] = await iterations(db)
    assert it["stop_reason"] == "crashed"
    assert it["error"] == "internal error: RuntimeError: tool source unavailable"
    mission = await mission_row(db, mission_id)
    assert mission["status"] == "active" and mission["next_run_at"] > datetime.now(UTC)
    assert mission["lease_owner"] is None


async def test_nul_characters_and_huge_usage_from_the_llm_are_stored(db: AsyncEngine) -> None:
    # PostgreSQL's text and jsonb refuse U+0000; an LLM can still send it.
    def script(request: CompletionRequest) -> CompletionResponse:
        if any(m.role == "tool" for m in request.messages):
            return final_answer("saved\x00", usage=TokenUsage(prompt_tokens=2**40))
        return tool_calls(("clock_now", {"timezone": "UTC\x00"}))

    mission_id = await add_mission(db)
    assert await make_worker(db, FunctionChatModel(script)).run_once() == ["succeeded"]
    [it] = await iterations(db)
    assert it["messages"][-1]["content"] == "saved\ufffd"
    assert it["prompt_tokens"] == 2**40 + 10
    async with db.connect() as conn:
        [call] = (await conn.execute(select(tool_invocations))).mappings().all()
    assert call["arguments"] == {"timezone": "UTC\ufffd"} and call["outcome"] == "error"
    assert (await mission_row(db, mission_id))["next_run_at"] > datetime.now(UTC)


async def test_an_outcome_the_database_refuses_is_stored_as_a_failure_not_rerun(
    db: AsyncEngine,
) -> None:
    class RefusingStore(PostgresMissionStore):
        refused = 0

        async def end_run(self, mission, end, **kwargs):  # type: ignore[no-untyped-def]
            if end.outcome.tool_invocations and not self.refused:
                self.refused += 1
                raise ValueError("value out of range")
            return await super().end_run(mission, end, **kwargs)

    mission_id = await add_mission(db)
    worker = make_worker(db, FunctionChatModel(clock_then_answer), store=RefusingStore(db))
    assert await worker.run_once() == ["failed"]
    [it] = await iterations(db)
    assert it["status"] == "failed" and it["stop_reason"] == "store_failed"
    assert "could not store the iteration: ValueError: value out of range" in it["error"]
    # stored as far as the database takes it: the log and its figures, without the calls
    assert [m["role"] for m in it["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert it["rounds"] == 2
    mission = await mission_row(db, mission_id)
    assert mission["lease_owner"] is None and mission["next_run_at"] > datetime.now(UTC)


async def test_a_failing_tick_logs_one_traceback_per_streak_and_the_recovery(
    db: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(db, FunctionChatModel(clock_then_answer))
    real_claim = worker.store.claim_due
    failures = iter([OSError("connection refused")] * 3)

    async def flaky_claim(**kwargs: Any) -> Any:
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return await real_claim(**kwargs)

    worker.store.claim_due = flaky_claim  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="worker.daemon.worker"):
        for _ in range(4):
            await worker.tick_safely()
    records = [r for r in caplog.records if r.name == "worker.daemon.worker"]
    assert [r.levelname for r in records] == ["ERROR", "WARNING", "WARNING", "INFO"]
    assert records[0].exc_info is not None and "connection refused" in records[0].getMessage()
    assert all(r.exc_info is None for r in records[1:])
    assert "recovered after 3 failed tick(s)" in records[-1].getMessage()


async def test_a_database_error_in_the_claim_is_one_short_line_not_the_statement(
    db: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(db, FunctionChatModel(clock_then_answer))
    statement = "WITH due AS (SELECT missions.id FROM missions " + "x" * 18_000 + ")"

    async def lost_claim(**kwargs: Any) -> Any:
        raise DBAPIError(statement, {}, ConnectionResetError("connection is closed"))

    worker.store.claim_due = lost_claim  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="worker.daemon.worker"):
        await worker.tick_safely()
    [record] = [r for r in caplog.records if r.name == "worker.daemon.worker"]
    assert record.levelname == "ERROR" and record.exc_info is None
    message = record.getMessage()
    assert "ConnectionResetError: connection is closed" in message and len(message) < 300


async def test_an_agent_over_its_daily_token_budget_does_not_run(db: AsyncEngine) -> None:
    admin = AdminStore(db)
    await admin.add_agent(
        name="thrifty", owner_user_id="u1", system_prompt="Be brief.", max_tokens_per_day=25
    )
    first = await add_mission(db, agent="thrifty")
    llm = FunctionChatModel(clock_then_answer)  # 30 tokens per run
    assert await make_worker(db, llm).run_once() == ["succeeded"]

    second = await add_mission(db, agent="thrifty")
    assert await make_worker(db, llm).run_once() == ["failed"]
    runs = {it["mission_id"]: it for it in await iterations(db)}
    assert runs[first]["status"] == "succeeded"
    assert runs[second]["stop_reason"] == "budget_exhausted"
    assert "used 30 of 25 tokens in the last 24 h" in runs[second]["error"]
    assert len(llm.requests) == 2, "the skipped run made no LLM request"
    assert (await mission_row(db, second))["next_run_at"] > datetime.now(UTC)


async def test_a_second_stop_request_cuts_the_grace_period_short(db: AsyncEngine) -> None:
    await add_mission(db)
    entered = asyncio.Event()

    async def hang(request: CompletionRequest) -> CompletionResponse:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    worker = make_worker(db, FunctionChatModel(hang))
    [task] = await worker.tick()
    await entered.wait()
    hurry = asyncio.Event()
    draining = asyncio.create_task(worker.drain(grace_s=3600, hurry=hurry))
    hurry.set()
    await asyncio.wait_for(draining, 30)  # not the hour of grace
    assert task.cancelled()
    [it] = await iterations(db)
    assert it["stop_reason"] == "interrupted"
