"""``mana-ai worker`` as a real process: a due mission runs, SIGTERM exits 0, SIGKILL mid-run
is recovered by another worker once the lease expires.

Each test drives the CLI as an operator would (``agents add``, ``missions add --due-now``),
against the test database and the fake OpenAI-compatible server over real HTTP.
"""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    TIMEOUT_S,
    cli,
    clock_then_answer,
    env_for,
    finished_iterations,
    free_port,
    run_cli,
    start_cli,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer


async def test_worker_runs_a_due_mission_serves_metrics_and_exits_0_on_sigterm(
    db: AsyncEngine, database_url: str
) -> None:
    port = free_port()
    with FakeLLMServer(clock_then_answer) as llm:
        env = env_for(
            database_url, llm.base_url, MANA_AI_METRICS_PORT=str(port), MANA_AI_WORKER_ID="e2e-1"
        )
        await cli(env, "agents", "add", "--name", "clockwatcher", "--owner", "alice")
        mission = await cli(
            env,
            "missions",
            "add",
            "--agent",
            "clockwatcher",
            "--objective",
            "Note the time.",
            "--cron",
            "0 9 * * *",
            "--due-now",
        )
        proc = await start_worker(env)
        try:
            [it] = await wait_until(lambda: finished_iterations(db), "a stored iteration")
            assert it["mission_id"] == mission["id"] and it["status"] == "succeeded"
            assert it["worker_id"] == "e2e-1"
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                health = await http.get("/healthz")
                assert health.status_code == 200 and health.json()["status"] == "ok"
                text = (await http.get("/metrics")).text
            assert 'mana_ai_missions_run_total{outcome="succeeded"} 1.0' in text
            assert 'mana_ai_tool_calls_total{outcome="ok",tool="clock_now"} 1.0' in text
        finally:
            code, stderr = await stop(proc)
    assert code == 0, stderr
    shown = await cli(env, "iterations", "show", str(it["id"]))
    assert [c["tool"] for c in shown["tool_invocations"]] == ["clock_now"]
    assert f'"mission_id": {mission["id"]}' in stderr  # structured logs carry the ids


async def test_sigkilled_worker_mission_is_rerun_by_another_once_its_lease_expires(
    db: AsyncEngine, database_url: str
) -> None:
    with FakeLLMServer(clock_then_answer) as llm:
        env = env_for(database_url, llm.base_url, MANA_AI_LEASE_S="2")
        await cli(env, "agents", "add", "--name", "doomed", "--owner", "bob")
        mission = await cli(
            env,
            "missions",
            "add",
            "--agent",
            "doomed",
            "--objective",
            "Note the time.",
            "--due-now",
        )
        llm.hang()
        victim = await start_worker(env | {"MANA_AI_WORKER_ID": "victim"})
        await asyncio.to_thread(llm.wait_for_requests, 1, TIMEOUT_S)  # mid-mission now
        victim.kill()
        await victim.wait()
        assert victim.returncode == -signal.SIGKILL
        llm.release()

        heir = await start_worker(env | {"MANA_AI_WORKER_ID": "heir"})
        try:
            [it] = await wait_until(lambda: finished_iterations(db), "the rerun iteration")
        finally:
            code, stderr = await stop(heir)
    assert code == 0, stderr
    assert it["mission_id"] == mission["id"]
    assert it["status"] == "succeeded" and it["worker_id"] == "heir" and it["attempt"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "61 * * * *"], "invalid cron expression '61 * * * *'"),
        (["--cron", "0 9 * * *", "--timezone", "Mars/Base"], "unknown timezone 'Mars/Base'"),
        (["--agent", "nobody", "--cron", "0 9 * * *"], "no agent named 'nobody'"),
    ],
)
async def test_missions_add_with_bad_input_exits_nonzero_and_writes_nothing(
    db: AsyncEngine, database_url: str, args: list[str], message: str
) -> None:
    env = env_for(database_url, "http://127.0.0.1:9/v1")
    await cli(env, "agents", "add", "--name", "someone", "--owner", "carol")
    full = ["missions", "add", "--objective", "x", *args]
    if "--agent" not in args:
        full += ["--agent", "someone"]
    code, _, err = await run_cli(env, *full)
    assert code == 1
    assert message in err
    assert await cli(env, "missions", "list") == []


async def test_sigterm_ends_a_tick_as_sigint_does_and_leaves_no_lease_behind(
    db: AsyncEngine, database_url: str
) -> None:
    # before, SIGTERM killed `tick --once` outright: its iteration stayed `running` and the
    # mission leased until the lease ran out (systemd, `timeout` and cron stop with SIGTERM)
    from sqlalchemy import select

    from worker.db.tables import mission_iterations, missions

    with FakeLLMServer(clock_then_answer) as llm:
        env = env_for(database_url, llm.base_url, MANA_AI_LEASE_S="600")
        await cli(env, "agents", "add", "--name", "ticker", "--owner", "dana")
        mission = await cli(
            env, "missions", "add", "--agent", "ticker", "--objective", "Time?", "--due-now"
        )
        llm.hang()
        proc = await start_cli(env, "tick", "--once")
        await asyncio.to_thread(llm.wait_for_requests, 1, TIMEOUT_S)  # mid-run now
        code, err = await stop(proc)  # SIGTERM
        llm.release()
        llm.unused_ok = True
    assert code == 143, err
    assert "stopped by SIGTERM" in err
    async with db.connect() as conn:
        it = (await conn.execute(select(mission_iterations))).mappings().one()
        row = (
            (await conn.execute(select(missions).where(missions.c.id == mission["id"])))
            .mappings()
            .one()
        )
    assert (it["status"], it["stop_reason"]) == ("failed", "interrupted"), it["error"]
    assert row["lease_owner"] is None
