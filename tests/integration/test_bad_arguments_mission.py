"""Tool-call arguments no storage can hold, or no parser should follow, in real missions: the
call gets an error result (or its text is made storable), and the iteration, its tool calls
and their policy decisions are all stored."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes import FakeLLMServer
from tests.integration.worker_harness import add_mission, iterations, make_worker, policy_setup
from worker.db.tables import tool_invocations
from worker.llm import OpenAICompatibleChatModel
from worker.queries.user_policy import PolicyStore


async def run_script(db: AsyncEngine, *rounds: list[tuple[str, Any]]) -> dict[str, Any]:
    """One mission whose model makes ``rounds`` of calls, then answers; the stored iteration."""
    await add_mission(db, cron=None)
    with FakeLLMServer() as server:
        for calls in rounds:
            server.enqueue_completion(tool_calls=calls)
        server.enqueue_completion(content="Done.")
        llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
        try:
            worker = make_worker(db, llm, policy=policy_setup(db, "log-only"))
            assert await worker.run_once() == ["succeeded"]
        finally:
            await llm.aclose()
    return (await iterations(db))[-1]


async def invocations(db: AsyncEngine) -> list[dict[str, Any]]:
    async with db.connect() as conn:
        rows = await conn.execute(select(tool_invocations).order_by(tool_invocations.c.id))
        return [dict(r) for r in rows.mappings()]


async def test_a_lone_surrogate_does_not_erase_the_iterations_record(db: AsyncEngine) -> None:
    it = await run_script(
        db,
        [("notes_create", {"title": "precious"})],
        [("notes_delete", {"id": 1})],
        [("clock_now", '{"timezone": "\\ud800"}')],
    )
    assert it["rounds"] == 4 and len(it["messages"]) == 9
    calls = await invocations(db)
    assert [c["tool"] for c in calls] == ["notes_create", "notes_delete", "clock_now"]
    assert calls[1]["policy_decision"]["reason"] == "destructive_not_opted_in"  # not lost
    assert calls[2]["arguments"] == {"timezone": "\ufffd"}  # made storable, not dropped
    assert it["prompt_tokens"] > 0


@pytest.mark.parametrize("depth", [65, 500, 10_000])
async def test_deeply_nested_arguments_get_an_error_result_and_the_run_is_stored(
    db: AsyncEngine, depth: int
) -> None:
    raw = '{"title": "t", "x": ' + "[" * depth + "]" * depth + "}"
    it = await run_script(db, [("notes_create", raw)])
    assert it["status"] == "succeeded"
    [call] = await invocations(db)
    assert call["outcome"] == "error"
    assert "nested more than 64 levels deep" in call["error"]


async def test_arguments_64_levels_deep_are_still_read(db: AsyncEngine) -> None:
    raw = '{"title": "t", "body": "b", "x": ' + "[" * 62 + "]" * 62 + "}"
    await run_script(db, [("notes_create", raw)])
    [call] = await invocations(db)
    assert "nested more than" not in (call["error"] or "")  # the schema judges it instead


async def test_the_report_counts_only_calls_the_gate_decided(db: AsyncEngine) -> None:
    await run_script(
        db,
        [("notes_delete", {"id": 1})],  # decided: a would-be denial
        [("notes_create", {"no_title": True})],  # invalid arguments: never reaches the gate
        [("no_such_tool", {})],  # unknown tool: never reaches the gate
    )
    async with db.connect() as conn:
        kinds = (
            await conn.execute(text("SELECT jsonb_typeof(policy_decision) FROM tool_invocations"))
        ).scalars()
        assert sorted(k or "sql null" for k in kinds) == ["object", "sql null", "sql null"]
    report = await PolicyStore(db).report(since=timedelta(hours=1))
    assert (report.calls, report.decided) == (3, 1)
    assert report.by_mode == {
        "log-only": {"calls": 1, "allowed": 0, "denied": 1, "asked": 0, "flagged": 0}
    }
