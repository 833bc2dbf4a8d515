"""The commands that start and run for a while (``worker``, ``tick --once``, ``serve``, ``mcp
serve``) as real processes whose database blinks during their start, after its first answer
(issue 31: the second engine's check and the schema's check made ``worker`` exit 1): each
rides it out as a running worker does and starts; a database that stays away fails the start
after ``MANA_AI_DB_START_WAIT_S`` with one line naming what it waited for.

A proxy between the process and PostgreSQL (``tests.fakes.db_proxy.FlakyProxy``) refuses the
connection of the second engine (the first of the command's own opening) and cuts the last
round trip of the start, the read of the schema's revision. Which ones those are is counted on
a clean start of the same code in this process (``tests.integration.test_start_faults`` breaks
every one of them in turn).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    cli,
    env_for,
    finished_iterations,
    run_cli,
    start_mcp_serve,
    start_serve,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer
from tests.fakes.db_proxy import FlakyProxy
from worker.daemon.app import open_app
from worker.daemon.tools_setup import open_served_tools
from worker.db.configured import open_database, wait_for_database
from worker.settings import Settings


async def counted(database_url: str, opening: Callable[[Settings], Awaitable[None]]) -> int:
    """The round trips of a clean ``opening`` (what a command does before it serves)."""
    async with FlakyProxy(database_url) as proxy:
        await opening(Settings(database_url=proxy.url_for(database_url)))
        return proxy.round_trips


async def worker_start(settings: Settings) -> None:
    await wait_for_database(settings)
    async with open_app(settings, migrate=True):
        pass


async def tick_start(settings: Settings) -> None:
    async with open_app(settings):
        pass


async def serve_start(settings: Settings) -> None:
    await wait_for_database(settings)
    async with open_database(settings, wait_s=settings.database.start_wait_s):
        pass


async def mcp_serve_start(settings: Settings) -> None:
    await wait_for_database(settings)
    async with open_served_tools(settings):
        pass


def broken_start(proxy: FlakyProxy, round_trips: int, *, first_check: bool) -> None:
    """Refuse the first connection after the first check (``first_check``: there is one,
    ``wait_for_database``'s, on a connection of its own) and cut the last of the start's
    ``round_trips``."""
    proxy.refuse_connection(2 if first_check else 1)
    proxy.break_round_trip(round_trips)


async def add_due_mission(env: dict[str, str]) -> int:
    await cli(env, "agents", "add", "--name", "early", "--owner", "alice")
    mission = await cli(
        env, "missions", "add", "--agent", "early", "--objective", "Say hi.", "--due-now"
    )
    return int(mission["id"])


async def test_a_worker_whose_database_blinks_as_it_starts_starts_and_runs_the_mission(
    db: AsyncEngine, database_url: str
) -> None:
    start = await counted(database_url, worker_start)
    with FakeLLMServer() as llm:
        mission = await add_due_mission(env_for(database_url, llm.base_url))
        async with FlakyProxy(database_url) as proxy:
            broken_start(proxy, start, first_check=True)
            proc = await start_worker(env_for(proxy.url_for(database_url), llm.base_url))

            async def stored() -> list[dict[str, Any]]:
                assert proc.returncode is None, "the worker exited"
                return await finished_iterations(db)

            try:
                [it] = await wait_until(stored, "a stored iteration")
            finally:
                code, stderr = await stop(proc)
            assert proxy.faults == 2, stderr
    assert (it["mission_id"], it["status"]) == (mission, "succeeded")
    assert code == 0, stderr
    assert "reading the schema revision of" in stderr and "failed (attempt 1: " in stderr


async def test_tick_once_whose_database_blinks_as_it_starts_runs_the_mission_and_exits_0(
    db: AsyncEngine, database_url: str
) -> None:
    start = await counted(database_url, tick_start)
    with FakeLLMServer() as llm:
        mission = await add_due_mission(env_for(database_url, llm.base_url))
        async with FlakyProxy(database_url) as proxy:
            broken_start(proxy, start, first_check=False)
            code, out, err = await run_cli(
                env_for(proxy.url_for(database_url), llm.base_url), "tick", "--once"
            )
            assert proxy.faults == 2, err
    assert (code, out) == (0, "tick ran 1 mission(s): succeeded\n"), err
    [it] = await finished_iterations(db)
    assert (it["mission_id"], it["status"]) == (mission, "succeeded")


@pytest.mark.parametrize("command", ["serve", "mcp serve"])
async def test_serve_and_mcp_serve_whose_database_blinks_as_they_start_serve(
    db: AsyncEngine, database_url: str, command: str
) -> None:
    starting, opening = {
        "serve": (start_serve, serve_start),
        "mcp serve": (start_mcp_serve, mcp_serve_start),
    }[command]
    start = await counted(database_url, opening)
    async with FlakyProxy(database_url) as proxy:
        broken_start(proxy, start, first_check=True)
        env = env_for(
            proxy.url_for(database_url),
            "http://127.0.0.1:9/v1",
            MANA_AI_API_PORT="0",
            MANA_AI_MCP_PORT="0",
        )
        server = await starting(env)  # it said where it serves
        try:
            base = server.url.removesuffix("/api/v1").removesuffix("/mcp")
            async with httpx.AsyncClient() as http:
                health = await http.get(f"{base}/healthz")
            assert health.status_code == 200, health.text
        finally:
            code, stderr = await server.stop()
        assert proxy.faults == 2, stderr
    assert code == 0, stderr


async def test_a_database_that_stays_away_fails_the_start_after_the_wait_in_one_line(
    db: AsyncEngine, database_url: str
) -> None:
    async with FlakyProxy(database_url) as proxy:
        await proxy.outage(3600)
        env = env_for(proxy.url_for(database_url), "http://127.0.0.1:9/v1")
        code, _, err = await run_cli(env | {"MANA_AI_DB_START_WAIT_S": "1"}, "tick", "--once")
    assert code == 1
    [line] = [line for line in err.splitlines() if line.startswith("mana-ai: error: ")]
    assert line.startswith("mana-ai: error: could not connect to PostgreSQL at postgresql+asyncpg")
    assert line.endswith("(retried for 1 s: MANA_AI_DB_START_WAIT_S)")
