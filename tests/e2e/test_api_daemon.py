"""The HTTP API as a script would use it, with real processes (``mana-ai serve``, a worker, the
fake LLM over HTTP): create an agent and a mission, run it now, read the iteration and its
replay, all over HTTP with a token; without a token, or with a revoked one: 401 and nothing
changed."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    cli,
    clock_then_answer,
    env_for,
    run_cli,
    start_serve,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer
from worker.db.tables import agents, missions


async def rows(db: AsyncEngine, table: Any) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_a_script_runs_a_mission_over_http_and_a_revoked_token_changes_nothing(
    db: AsyncEngine, database_url: str
) -> None:
    with FakeLLMServer(clock_then_answer) as llm:
        env = env_for(database_url, llm.base_url, MANA_AI_API_PORT="0")
        made = await cli(env, "admin", "token", "create", "ci")
        server = await start_serve(env)
        worker = await start_worker(env)
        api = server.url  # http://127.0.0.1:PORT/api/v1
        headers = {"Authorization": f"Bearer {made['token']}"}
        try:
            async with httpx.AsyncClient(headers=headers, timeout=30) as http:
                agent = await http.post(
                    f"{api}/agents", json={"name": "clock", "owner": "me", "tools": ["clock_now"]}
                )
                assert agent.status_code == 201, agent.text
                mission = await http.post(
                    f"{api}/missions",
                    json={"agent": "clock", "objective": "What time is it?", "cron": "0 9 * * *"},
                )
                assert mission.status_code == 201, mission.text
                mission_id = mission.json()["id"]
                ran = await http.post(f"{api}/missions/{mission_id}/run")
                assert ran.status_code == 200 and ran.json()["changed"], ran.text

                async def finished() -> Any:
                    listed = await http.get(f"{api}/iterations", params={"mission": mission_id})
                    done = [i for i in listed.json()["iterations"] if i["status"] == "succeeded"]
                    return done[0] if done else None

                it = await wait_until(finished, "the iteration over HTTP")
                shown = (await http.get(f"{api}/iterations/{it['id']}")).json()
                assert [c["tool"] for c in shown["tool_invocations"]] == ["clock_now"]
                replay = (await http.get(f"{api}/iterations/{it['id']}/replay")).json()
                assert [e["event"] for e in replay["events"]].count("round") == 2
                assert (await http.get(f"{api}/missions/{mission_id}")).json()["status"] == "active"
            async with httpx.AsyncClient(timeout=30) as anonymous:
                refused = await anonymous.post(
                    f"{api}/agents", json={"name": "other", "owner": "me"}
                )
                assert refused.status_code == 401
            code, _, err = await run_cli(env, "admin", "token", "revoke", str(made["id"]))
            assert code == 0, err
            async with httpx.AsyncClient(headers=headers, timeout=30) as revoked:
                again = await revoked.post(f"{api}/agents", json={"name": "other", "owner": "me"})
                assert again.status_code == 401
                paused = await revoked.post(f"{api}/missions/{mission_id}/pause")
                assert paused.status_code == 401
        finally:
            await stop(worker)
            await server.stop()
    assert await rows(db, agents) == 1 and await rows(db, missions) == 1
    async with db.connect() as conn:
        status = (await conn.execute(select(missions.c.status))).scalar_one()
    assert status == "active"  # the revoked token's pause changed nothing


async def test_serve_on_a_port_in_use_is_a_settings_error_at_once_even_without_its_database() -> (
    None
):
    import socket
    import time

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = env_for(
            "postgresql://mana@127.0.0.1:9/mana",  # nothing listens there: it would wait
            "http://127.0.0.1:9/v1",
            MANA_AI_API_PORT=str(port),
        )
        started = time.monotonic()
        code, _, err = await run_cli(env, "serve")
    assert code == 2 and "MANA_AI_API_PORT: cannot listen on" in err
    assert time.monotonic() - started < 30  # not after the minute's wait for the database
