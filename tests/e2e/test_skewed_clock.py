"""A ``mana-ai worker`` process whose clock is 10 minutes off the database's, either way (the
machine's clock faked with libfaketime, as an unsynchronised host would be): a due mission
runs once, the worker claims it no more than twice in 12 seconds (a clock behind claimed and
skipped 3,640 times in 12 s), and its next run is where the database's clock puts it (a clock
ahead put it 10 minutes late). Skipped where libfaketime is not installed (Debian's
``faketime`` package; ``.ci/run`` installs it)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    cli,
    env_for,
    finished_iterations,
    start_worker,
    stop,
    wait_until,
)
from tests.fakes import FakeLLMServer, final_answer_responder
from worker.db.tables import missions
from worker.schedule import next_run_after

LIBFAKETIME = next(
    (p for p in Path("/usr/lib").glob("*/faketime/libfaketime.so.1") if p.exists()), None
)
SKEWS = {"-10m": timedelta(minutes=-10), "+10m": timedelta(minutes=10)}


async def database_now(db: AsyncEngine) -> datetime:
    async with db.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
    return now


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime is not installed (apt faketime)")
@pytest.mark.parametrize("offset", ["-10m", "+10m"])
async def test_a_worker_whose_clock_is_off_runs_a_due_mission_once_on_the_databases_clock(
    db: AsyncEngine, database_url: str, offset: str
) -> None:
    # hourly, half an hour from now: no run falls due again while the test watches
    cron = f"{((await database_now(db)).minute + 30) % 60} * * * *"
    with FakeLLMServer(final_answer_responder("Done.")) as llm:
        env = env_for(database_url, llm.base_url, MANA_AI_TICK_INTERVAL_S="0.2")
        await cli(env, "agents", "add", "--name", "skewed", "--owner", "u1")
        mission = await cli(
            env,
            "missions",
            "add",
            "--agent",
            "skewed",
            "--objective",
            "Go.",
            "--cron",
            cron,
            "--due-now",
        )
        before = await database_now(db)
        faked = env | {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": offset}
        proc = await start_worker(faked | {"MANA_AI_LOG_LEVEL": "INFO"})
        try:
            await wait_until(lambda: finished_iterations(db), "the mission's run")
            await asyncio.sleep(12)  # what a hot loop claimed in 12 s, this one must not
        finally:
            code, log = await stop(proc)
        after = await database_now(db)
    assert code == 0, log
    claims = [json.loads(line) for line in log.splitlines() if "tick claimed" in line]
    assert 1 <= len(claims) <= 2, claims
    # the worker's clock was off indeed: its log's times are the offset away from the database's
    seen = datetime.fromisoformat(claims[0]["ts"]) - before
    assert abs(seen - SKEWS[offset]) < timedelta(minutes=2), seen
    assert len(await finished_iterations(db)) == 1
    async with db.connect() as conn:
        next_run = (
            await conn.execute(select(missions.c.next_run_at).where(missions.c.id == mission["id"]))
        ).scalar_one()
    assert next_run in {next_run_after(cron, "UTC", before), next_run_after(cron, "UTC", after)}
