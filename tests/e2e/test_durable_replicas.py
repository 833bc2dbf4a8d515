"""Durable iterations with real worker processes: a worker killed (SIGKILL) or stopped
(SIGTERM, no grace) in the middle of a mission is taken over by another, which resumes after
the last checkpoint; a finished write is never made twice."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    TIMEOUT_S,
    cli,
    env_for,
    finished_iterations,
    run_cli,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer, chat_completion_body
from worker.db.tables import notes, tool_invocations


class NoteThenHold:
    """Round 1: create a note. Round 2: hold the answer until ``release``, then answer."""

    def __init__(self) -> None:
        self.held = threading.Event()

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not any(m.get("role") == "tool" for m in body["messages"]):
            return 200, chat_completion_body(tool_calls=[("notes_create", {"title": "once"})])
        self.held.wait(TIMEOUT_S)
        return 200, chat_completion_body(content="The note is saved.")


async def count_notes(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(notes))).scalar_one())


async def one_finished(db: AsyncEngine) -> dict[str, Any] | None:
    """The iteration once it ended for good (an interrupted attempt has not)."""
    done = [it for it in await finished_iterations(db) if it["stop_reason"] != "interrupted"]
    return done[0] if done else None


async def add_note_mission(env: dict[str, str]) -> None:
    await cli(env, "agents", "add", "--name", "scribe", "--owner", "ada")
    await cli(
        env, "missions", "add", "--agent", "scribe", "--objective", "Save a note.", "--due-now"
    )


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_a_worker_stopped_between_rounds_is_resumed_not_restarted(
    db: AsyncEngine, database_url: str, how: str
) -> None:
    model = NoteThenHold()
    with FakeLLMServer(model) as llm:
        env = env_for(database_url, llm.base_url, MANA_AI_LEASE_S="2", MANA_AI_SHUTDOWN_GRACE_S="0")
        await add_note_mission(env)
        victim = await start_worker(env | {"MANA_AI_WORKER_ID": "victim"})
        await asyncio.to_thread(llm.wait_for_requests, 2, TIMEOUT_S)  # round 2 is waiting
        if how == "SIGKILL":
            victim.kill()
            await victim.wait()
        else:
            code, stderr = await stop(victim)  # SIGTERM with no grace: interrupted
            assert code == 0, stderr
        model.held.set()
        heir = await start_worker(env | {"MANA_AI_WORKER_ID": "heir"})
        try:
            it = await wait_until(lambda: one_finished(db), "the resumed iteration")
        finally:
            code, stderr = await stop(heir)
        assert code == 0, stderr
        heir_request = llm.requests[2]["messages"]

    assert await count_notes(db) == 1
    assert it["status"] == "succeeded" and it["attempt"] == 2 and it["worker_id"] == "heir"
    assert it["attempts"][1]["resumed_after_round"] == 1
    # the heir asked round 2 with round 1 (the note's creation) already in the conversation
    assert [m["role"] for m in heir_request][:4] == ["system", "user", "assistant", "tool"]
    async with db.connect() as conn:
        calls = (await conn.execute(select(tool_invocations))).mappings().all()
    assert [(c["tool"], c["outcome"], c["attempt"]) for c in calls] == [("notes_create", "ok", 1)]
    code, out, _ = await run_cli(env, "iterations", "show", str(it["id"]))
    assert code == 0
    assert "attempts: 1 by victim; 2 by heir (resumed after round 1)" in out
    assert out.index("== attempt 2 (worker heir) resumed here, after round 1 ==") < out.index(
        "-- round 2 --"
    )


async def test_a_worker_killed_right_after_a_write_committed_never_makes_it_twice(
    db: AsyncEngine, database_url: str
) -> None:
    with FakeLLMServer(NoteThenHold()) as llm:
        llm.responder.held.set()  # type: ignore[attr-defined]
        env = env_for(database_url, llm.base_url, MANA_AI_LEASE_S="2")
        await add_note_mission(env)
        victim = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.e2e.worker_dying_after_a_write",
            env=env | {"MANA_AI_WORKER_ID": "victim"},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await asyncio.wait_for(victim.wait(), TIMEOUT_S)
        assert victim.returncode == -signal.SIGKILL  # it died inside the call
        assert await count_notes(db) == 1
        heir = await start_worker(env | {"MANA_AI_WORKER_ID": "heir"})
        try:
            it = await wait_until(lambda: one_finished(db), "the resumed iteration")
        finally:
            code, stderr = await stop(heir)
        assert code == 0, stderr
        [heir_request] = llm.requests[1:]

    # notes_create is idempotent: the heir made the call again with the same key, and got the
    # note the victim had made; no second note, and the model read the call's own result
    assert await count_notes(db) == 1
    assert it["status"] == "succeeded" and it["attempt"] == 2
    told = [m["content"] for m in heir_request["messages"] if m["role"] == "tool"]
    assert len(told) == 1 and json.loads(told[0])["title"] == "once"
    async with db.connect() as conn:
        [call] = (await conn.execute(select(tool_invocations))).mappings().all()
    assert (call["tool"], call["outcome"], call["attempt"]) == ("notes_create", "ok", 1)
