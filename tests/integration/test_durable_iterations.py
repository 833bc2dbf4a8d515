"""Durable iterations against real PostgreSQL: a worker that stops (its lease expires while
it hangs) is taken over, and the takeover resumes after the last checkpoint instead of
starting again; a write that was in flight is not run twice, and the model is told."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, ToolContext
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.worker_harness import add_mission, iterations, make_worker
from worker.db.tables import notes, tool_invocations
from worker.tools import builtin_tools


async def expire_lease(engine: AsyncEngine, mission_id: int) -> None:
    """What a dead worker leaves behind once its lease runs out."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE missions SET lease_expires_at = now() - interval '1 second' WHERE id = :id"
            ),
            {"id": mission_id},
        )


async def count_notes(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(notes))).scalar_one())


async def invocations(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(tool_invocations).order_by(tool_invocations.c.id))
        return [dict(r) for r in rows.mappings()]


def rounds_in(request: CompletionRequest) -> int:
    return sum(m.role == "assistant" for m in request.messages)


async def test_a_takeover_resumes_after_the_round_that_wrote(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=None)
    round_two = asyncio.Event()

    async def victim_model(request: CompletionRequest) -> CompletionResponse:
        if rounds_in(request) == 0:
            return tool_calls(("notes_create", {"title": "once"}))
        round_two.set()
        await asyncio.Event().wait()  # the worker "dies" while round 2 waits for the model
        raise AssertionError("unreachable")

    victim = make_worker(db, FunctionChatModel(victim_model), worker_id="victim")
    [task] = await victim.tick()
    await round_two.wait()
    await expire_lease(db, mission_id)

    heir_requests: list[CompletionRequest] = []

    def heir_model(request: CompletionRequest) -> CompletionResponse:
        heir_requests.append(request)
        return final_answer("The note is saved.")

    heir = make_worker(db, FunctionChatModel(heir_model), worker_id="heir")
    try:
        assert await heir.run_once() == ["succeeded"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert await count_notes(db) == 1
    [it] = await iterations(db)
    assert it["attempt"] == 2 and it["rounds"] == 2 and it["stop_reason"] == "final_answer"
    assert it["attempts"][1] | {"started_at": None} == {
        "attempt": 2,
        "worker_id": "heir",
        "started_at": None,
        "resumed_after_round": 1,
        "resumed_from": "running",
    }
    # the heir's first request went on from round 1, with its result in the conversation
    [request] = heir_requests
    assert [m.role for m in request.messages[:4]] == ["system", "user", "assistant", "tool"]
    [call] = await invocations(db)
    assert (call["tool"], call["outcome"], call["attempt"]) == ("notes_create", "ok", 1)
    assert call["idempotency_key"] == f"{it['id']}:1:0"


async def test_a_write_in_flight_is_not_run_again_and_the_model_is_told_what_it_did(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db, cron=None)
    created = asyncio.Event()
    builtin = {t.name: t for t in builtin_tools(db)}

    async def create_then_die(args: dict[str, Any], ctx: ToolContext) -> Any:
        result = await builtin["notes_create"].handler(args, ctx)  # committed
        created.set()
        await asyncio.Event().wait()  # the worker "dies" before the outcome is recorded
        return result

    # a write whose tool does not promise to apply a key once, and whose effect does not
    # commit with its record (an idempotent one, or a built-in's effect, is made again on
    # resume instead: tests/e2e/test_durable_replicas.py, test_approval_crash.py)
    dying = dataclasses.replace(
        builtin["notes_create"], handler=create_then_die, idempotent=False, effect=None
    )
    others = [t for t in builtin.values() if t.name != "notes_create"]

    def victim_model(request: CompletionRequest) -> CompletionResponse:
        return tool_calls(("clock_now", {}), ("notes_create", {"title": "once"}))

    victim = make_worker(
        db,
        FunctionChatModel(victim_model),
        worker_id="victim",
        tools_for=lambda m: [*others, dying],
    )
    [task] = await victim.tick()
    await created.wait()
    await expire_lease(db, mission_id)

    heir_requests: list[CompletionRequest] = []

    def heir_model(request: CompletionRequest) -> CompletionResponse:
        heir_requests.append(request)
        return final_answer("Done.")

    unpromised = dataclasses.replace(builtin["notes_create"], idempotent=False, effect=None)
    heir = make_worker(
        db,
        FunctionChatModel(heir_model),
        worker_id="heir",
        tools_for=lambda m: [*others, unpromised],
    )
    try:
        assert await heir.run_once() == ["succeeded"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert await count_notes(db) == 1  # not created a second time
    [request] = heir_requests
    results = [m.content or "" for m in request.messages if m.role == "tool"]
    # the read was stored with the write's start: it keeps its result; the write is not rerun
    assert len(results) == 2
    assert "its outcome is unknown" in results[1]
    assert "The tool reports: that call created note" in results[1]
    calls = await invocations(db)
    by_tool = {c["tool"]: c for c in calls}
    assert by_tool["notes_create"]["outcome"] == "unknown"
    assert "was running when attempt 1 of this run stopped" in by_tool["notes_create"]["error"]
    assert by_tool["clock_now"]["outcome"] == "ok" and by_tool["clock_now"]["attempt"] == 1
    assert len(calls) == 2


async def test_read_only_rounds_are_committed_every_few_rounds_not_every_round(
    db: AsyncEngine,
) -> None:
    mission_id = await add_mission(db, cron=None)
    seen_rounds: list[int] = []
    stop = asyncio.Event()

    async def reader(request: CompletionRequest) -> CompletionResponse:
        seen_rounds.append(rounds_in(request))
        if rounds_in(request) == 4:
            stop.set()
            await asyncio.Event().wait()
        return tool_calls(("clock_now", {}))

    worker = make_worker(db, FunctionChatModel(reader), worker_id="w")
    [task] = await worker.tick()
    await stop.wait()
    # four read-only rounds ran; the third was committed (every 3 rounds), the fourth not yet
    [it] = await iterations(db)
    assert it["status"] == "running" and it["rounds"] == 3
    assert len(await invocations(db)) == 3
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await expire_lease(db, mission_id)
