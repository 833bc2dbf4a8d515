"""Approvals with real worker processes and the ``mana-ai`` command: a mission's
``notes_delete`` in ``ask`` parks the iteration (the note still there, no lease held);
``approvals approve`` lets the next tick delete it exactly once, ``approvals deny`` keeps it and
the model's next request carries the denial; two workers after a decision, and a worker
SIGKILLed inside the approved call, never run it twice."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ToolContext
from tests.e2e.daemon_harness import (
    TIMEOUT_S,
    cli,
    env_for,
    run_cli,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer, chat_completion_body
from worker.db.tables import approval_requests, mission_iterations, missions, notes
from worker.tools import builtin_tools


class DeleteThenAnswer:
    """Round 1: delete note ``note_id``. Then: answer."""

    def __init__(self) -> None:
        self.note_id = 0

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return 200, chat_completion_body(content="Done.")
        call = ("notes_delete", {"id": self.note_id})
        return 200, chat_completion_body(tool_calls=[call])


async def setup(db: AsyncEngine, env: dict[str, str], model: DeleteThenAnswer) -> int:
    """A note of user ada and a mission of hers, due now, that deletes it."""
    create = {t.name: t for t in builtin_tools(db)}["notes_create"]
    note = await create.handler({"title": "old"}, ToolContext(user_id="ada"))
    model.note_id = int(note["id"])
    await cli(env, "agents", "add", "--name", "tidy", "--owner", "ada")
    await cli(env, "missions", "add", "--agent", "tidy", "--objective", "Tidy.", "--due-now")
    return model.note_id


async def note_count(db: AsyncEngine) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(notes))).scalar_one())


async def request_of(db: AsyncEngine) -> dict[str, Any] | None:
    async with db.connect() as conn:
        row = (await conn.execute(select(approval_requests))).mappings().first()
    return dict(row) if row is not None else None


async def iteration(db: AsyncEngine) -> dict[str, Any]:
    async with db.connect() as conn:
        [row] = (await conn.execute(select(mission_iterations))).mappings().all()
    return dict(row)


async def finished(db: AsyncEngine) -> dict[str, Any] | None:
    it = await iteration(db)
    return it if it["status"] in ("succeeded", "failed") else None


def asking_env(database_url: str, llm: FakeLLMServer) -> dict[str, str]:
    return env_for(
        database_url,
        llm.base_url,
        MANA_AI_POLICY_MODE="enforce",
        MANA_AI_POLICY_DESTRUCTIVE="ask",
        MANA_AI_LEASE_S="2",
    )


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_parked_delete_runs_once_when_approved_and_never_when_denied(
    db: AsyncEngine, database_url: str, decision: str
) -> None:
    model = DeleteThenAnswer()
    with FakeLLMServer(model) as llm:
        env = asking_env(database_url, llm)
        await setup(db, env, model)
        worker = await start_worker(env)
        try:
            request = await wait_until(lambda: request_of(db), "the approval request")
            parked = await wait_until(
                lambda: _parked(db), "the iteration parked and its lease released"
            )
            assert await note_count(db) == 1 and parked["status"] == "awaiting_approval"
            extra = ["--reason", "keep it"] if decision == "deny" else []
            code, _, err = await run_cli(
                env, "approvals", decision, str(request["id"]), "--by", "ops", *extra
            )
            assert code == 0, err
            it = await wait_until(lambda: finished(db), "the iteration to finish")
        finally:
            code, stderr = await stop(worker)
        assert code == 0, stderr
        requests = list(llm.requests)
    assert it["status"] == "succeeded" and it["attempt"] == 2
    assert await note_count(db) == (0 if decision == "approve" else 1)
    assert len(requests) == 2  # round 1 once, then the answer
    results = [m["content"] for m in requests[1]["messages"] if m["role"] == "tool"]
    if decision == "deny":
        assert "denied by ops" in results[0] and "keep it" in results[0]
        reminders = [m["content"] for m in requests[1]["messages"] if m["role"] == "system"]
        assert any("do not call it again" in r for r in reminders[1:])
    else:
        assert '"deleted"' in results[0]
    async with db.connect() as conn:
        mission = (await conn.execute(select(missions))).mappings().one()
    assert (mission["status"], mission["lease_owner"]) == ("completed", None)


async def _parked(db: AsyncEngine) -> dict[str, Any] | None:
    it = await iteration(db)
    async with db.connect() as conn:
        lease = (await conn.execute(select(missions.c.lease_owner))).scalar_one()
    return it if it["status"] == "awaiting_approval" and lease is None else None


async def test_two_workers_after_a_decision_run_the_approved_call_once(
    db: AsyncEngine, database_url: str
) -> None:
    model = DeleteThenAnswer()
    with FakeLLMServer(model) as llm:
        env = asking_env(database_url, llm)
        await setup(db, env, model)
        asker = await start_worker(env | {"MANA_AI_WORKER_ID": "asker"})
        request = await wait_until(lambda: request_of(db), "the approval request")
        await wait_until(lambda: _parked(db), "the run parked")
        asker.kill()  # SIGKILL: it holds no lease, it is parked
        await asker.wait()
        code, _, err = await run_cli(env, "approvals", "approve", str(request["id"]))
        assert code == 0, err
        workers = [await start_worker(env | {"MANA_AI_WORKER_ID": f"w{n}"}) for n in (1, 2)]
        try:
            it = await wait_until(lambda: finished(db), "the iteration to finish")
        finally:
            for w in workers:
                await stop(w)
        deletes = [
            r for r in llm.requests if not any(m.get("role") == "tool" for m in r["messages"])
        ]
    assert it["status"] == "succeeded" and await note_count(db) == 0
    assert len(deletes) == 1  # the model was asked for round 1 once: by the asker
    async with db.connect() as conn:
        outcomes = (
            await conn.execute(select(func.count()).select_from(approval_requests))
        ).scalar_one()
    assert outcomes == 1  # asked once


async def test_a_worker_killed_right_after_the_approved_call_committed_is_not_made_to_run_it_again(
    db: AsyncEngine, database_url: str
) -> None:
    model = DeleteThenAnswer()
    with FakeLLMServer(model) as llm:
        env = asking_env(database_url, llm)
        await setup(db, env, model)
        victim = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.e2e.worker_dying_after_a_write",
            env=env | {"MANA_AI_WORKER_ID": "victim", "DYING_TOOL": "notes_delete"},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        request = await wait_until(lambda: request_of(db), "the approval request")
        code, _, err = await run_cli(env, "approvals", "approve", str(request["id"]))
        assert code == 0, err
        await asyncio.wait_for(victim.wait(), TIMEOUT_S)
        assert victim.returncode == -signal.SIGKILL  # it died inside the approved delete
        assert await note_count(db) == 0
        heir = await start_worker(env | {"MANA_AI_WORKER_ID": "heir"})
        try:
            it = await wait_until(lambda: finished(db), "the resumed iteration")
        finally:
            code, stderr = await stop(heir)
        assert code == 0, stderr
        told = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    # the delete committed with its record: the heir knows it ran, and what it did
    assert it["status"] == "succeeded" and it["attempt"] == 3
    assert json.loads(told[0]) == {"deleted": 1, "title": "old"}, told
    async with db.connect() as conn:
        asked = (
            await conn.execute(select(func.count()).select_from(approval_requests))
        ).scalar_one()
    assert asked == 1
