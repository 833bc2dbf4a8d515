"""The rate limit is exact across replicas: two ``mana-ai worker`` processes race 40 calls of
one tool by one user against a limit of 30 per 60 s."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    TIMEOUT_S,
    cli,
    env_for,
    finished_iterations,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer, chat_completion_body
from worker.db.tables import notes, tool_invocations

MISSIONS = 4
CALLS_PER_MISSION = 10


def ten_notes_then_answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Round 1: ten notes_create calls; round 2: the final answer."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return 200, chat_completion_body(content="Saved what I could.")
    calls = [("notes_create", {"title": f"note {n}"}) for n in range(CALLS_PER_MISSION)]
    return 200, chat_completion_body(tool_calls=calls)


@pytest.mark.parametrize(("mode", "notes_made"), [("enforce", 30), ("log-only", 40)])
async def test_two_workers_share_the_limit_of_30_calls_exactly(
    db: AsyncEngine, database_url: str, mode: str, notes_made: int
) -> None:
    with FakeLLMServer(ten_notes_then_answer) as llm:
        env = env_for(
            database_url,
            llm.base_url,
            MANA_AI_POLICY_MODE=mode,
            MANA_AI_MAX_CONCURRENT_MISSIONS="2",
        )
        await cli(env, "agents", "add", "--name", "scribe", "--owner", "racer")
        for n in range(MISSIONS):
            await cli(
                env, "missions", "add", "--agent", "scribe", "--objective", f"m{n}", "--due-now"
            )
        # Hold every answer until all four missions asked: with two missions per worker at
        # most, that means both workers run two each, and their calls race.
        llm.hang()
        workers = [await start_worker(env | {"MANA_AI_WORKER_ID": f"w{n}"}) for n in (1, 2)]
        try:
            await asyncio.to_thread(llm.wait_for_requests, MISSIONS, TIMEOUT_S)
            llm.release()
            done = await wait_until(lambda: _all_finished(db), f"{MISSIONS} finished iterations")
        finally:
            results = [await stop(w) for w in workers]
    assert all(code == 0 for code, _ in results), results
    assert {it["worker_id"] for it in done} == {"w1", "w2"}
    assert all(it["status"] == "succeeded" for it in done)

    async with db.connect() as conn:
        made = (await conn.execute(select(func.count()).select_from(notes))).scalar_one()
        calls = (await conn.execute(select(tool_invocations))).mappings().all()
    assert made == notes_made
    assert len(calls) == MISSIONS * CALLS_PER_MISSION
    refused = [c for c in calls if c["policy_decision"]["verdict"] == "deny"]
    assert len(refused) == 10
    assert {c["policy_decision"]["reason"] for c in refused} == {"rate_limited"}
    assert {c["policy_mode"] for c in calls} == {mode}
    if mode == "enforce":
        assert all(c["outcome"] == "denied" for c in refused)  # never executed
    else:
        assert all(c["outcome"] == "ok" for c in refused)  # ran: would-be denials


async def _all_finished(db: AsyncEngine) -> list[dict[str, Any]] | None:
    done = await finished_iterations(db)
    return done if len(done) == MISSIONS else None
