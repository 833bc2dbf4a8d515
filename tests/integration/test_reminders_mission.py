"""The reminder channel of real missions (real PostgreSQL, the fake LLM server over HTTP):
what the model receives, what is audited, and that a broken producer costs nothing else."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes import FakeLLMServer
from tests.fakes.provider_zoo import system_message_first_only
from tests.integration.worker_harness import add_mission, iterations, make_worker
from worker.cli import main
from worker.db.tables import agents, mission_iterations
from worker.llm import OpenAICompatibleChatModel


def reminders_in(body: dict[str, Any]) -> list[str]:
    return [
        m["content"]
        for m in body["messages"]
        if m["role"] == "system" and (m.get("content") or "").startswith("<reminder>")
    ]


async def run_mission(db: AsyncEngine, server: FakeLLMServer) -> dict[str, Any]:
    llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
    try:
        assert await make_worker(db, llm).run_once() == ["succeeded"]
    finally:
        await llm.aclose()
    return (await iterations(db))[-1]


async def spent_tokens(db: AsyncEngine, tokens: int) -> None:
    """An earlier iteration of agent a1 that used ``tokens`` in the last 24 hours."""
    mission_id = await add_mission(db, cron=None, due_in=timedelta(days=30))
    async with db.begin() as conn:
        await conn.execute(
            insert(mission_iterations).values(
                mission_id=mission_id,
                scheduled_for=datetime.now(UTC) - timedelta(hours=1),
                status="succeeded",
                worker_id="earlier",
                prompt_tokens=tokens,
            )
        )


async def test_a_mission_at_80_percent_of_its_budget_is_told_in_its_first_request(
    db: AsyncEngine,
) -> None:
    await spent_tokens(db, 800)
    async with db.begin() as conn:
        await conn.execute(update(agents).values(max_tokens_per_day=1000))
    await add_mission(db, cron=None)
    with FakeLLMServer() as server:
        server.enqueue_completion(content="Done.", prompt_tokens=10, completion_tokens=5)
        it = await run_mission(db, server)
        [first] = server.requests

    [budget] = reminders_in(first)
    assert budget.startswith("<reminder>80 % of the agent's daily token budget is used")
    assert not any("<reminder>" in (m.get("content") or "") for m in it["messages"])
    assert it["reminders"] == [
        {
            "round": 1,
            "producer": "token_budget",
            "text": budget.removeprefix("<reminder>").removesuffix("</reminder>"),
        }
    ]


async def test_a_repeated_failing_call_gets_the_retry_loop_reminder_and_it_is_audited(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await add_mission(db, cron=None)
    with FakeLLMServer() as server:
        for _ in range(4):
            server.enqueue_completion(tool_calls=[("notes_read", {"id": 999})])
        server.enqueue_completion(content="I could not find it.")
        it = await run_mission(db, server)
        requests = list(server.requests)

    # three identical failing calls (rounds 1-3): the request of round 4 carries the reminder
    assert not any("same arguments" in r for body in requests[:3] for r in reminders_in(body))
    [loop] = [r for r in reminders_in(requests[3]) if "same arguments" in r]
    assert "You called notes_read with the same arguments 3 times in a row and it failed" in loop
    audited = [r for r in it["reminders"] if r["producer"] == "retry_loop"]
    assert audited and audited[0]["round"] == 4
    assert [r["producer"] for r in it["reminders"] if r["round"] == 5][:1] == ["retry_loop"]

    # iterations show prints each reminder under its round
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    code = await asyncio.to_thread(main, ["iterations", "show", str(it["id"])])
    out = capsys.readouterr().out
    assert code == 0
    round_4 = out.index("-- round 4 --")
    assert out.index("[reminder retry_loop] You called notes_read", round_4) < out.index(
        "-- round 5 --"
    )
    assert out.index("[reminder rounds_left] Round 4 of 5", round_4) < out.index("-- round 5 --")


async def test_a_producer_that_raises_costs_nothing_but_its_reminder(
    db: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> str:
        raise RuntimeError("producer bug")

    monkeypatch.setattr("worker.run.reminder_channel.rounds_left_reminder", broken)
    labels = {"producer": "rounds_left"}
    before = REGISTRY.get_sample_value("mana_ai_reminder_producer_errors_total", labels) or 0.0
    await add_mission(db, cron=None)
    with FakeLLMServer() as server:
        server.enqueue_completion(content="Done.")
        it = await run_mission(db, server)
    assert it["status"] == "succeeded" and it["stop_reason"] == "final_answer"
    after = REGISTRY.get_sample_value("mana_ai_reminder_producer_errors_total", labels)
    assert after == before + 1


async def test_reminders_can_be_turned_off(db: AsyncEngine) -> None:
    await spent_tokens(db, 900)
    async with db.begin() as conn:
        await conn.execute(update(agents).values(max_tokens_per_day=1000, max_rounds=1))
    await add_mission(db, cron=None)
    with FakeLLMServer() as server:
        server.enqueue_completion(content="Done.")
        llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
        try:
            worker = make_worker(db, llm)
            worker.runner.reminders = False
            assert await worker.run_once() == ["succeeded"]
        finally:
            await llm.aclose()
        assert reminders_in(server.requests[0]) == []
    async with db.connect() as conn:
        stored = (await conn.execute(select(mission_iterations.c.reminders))).scalars().all()
    assert stored and all(r == [] for r in stored)


@pytest.mark.parametrize(("role", "outcome"), [("system", "failed"), ("user", "succeeded")])
async def test_reminders_as_user_messages_pass_templates_that_refuse_late_system_messages(
    db: AsyncEngine, role: str, outcome: str
) -> None:
    await add_mission(db, cron=None)
    async with db.begin() as conn:
        await conn.execute(update(agents).values(max_rounds=2))
    with FakeLLMServer(checks=[system_message_first_only]) as server:
        server.enqueue_completion(tool_calls=[("clock_now", {})])
        server.enqueue_completion(content="Done.")
        server.unused_ok = outcome == "failed"  # the refused round 2 never gets its reply
        llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
        try:
            worker = make_worker(db, llm)
            worker.runner.reminder_role = role  # type: ignore[assignment]
            assert await worker.run_once() == [outcome]
        finally:
            await llm.aclose()
        last = server.requests[-1]["messages"][-1]
    # round 2 of 2 carries the last-round reminder, as the configured role
    assert last["role"] == role and "the last one" in last["content"]
