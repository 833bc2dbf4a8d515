"""One clock decides what is due and when it runs next (the database's), and each mission's
catch-up policy decides what becomes of the runs it missed (issue 31, items 2 and 7), against
real PostgreSQL.

* A worker whose clock is 10 minutes behind or ahead of the database's runs a due mission
  once, never claims it again at once, and writes its next run where the database's clock
  puts it (a clock behind claimed and skipped in a hot loop: 3,640 claims in 12 s; ahead,
  the next run came 10 minutes late).
* ``skip``: a missed run does not run; ``once``: the missed runs collapse into one; ``all``:
  each missed run within the window runs, oldest first, while the agent's daily budget has
  room (an outage never re-fires a day of runs past the budget).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.testing import FunctionChatModel, final_answer
from tests.integration.worker_harness import add_mission, iterations, make_worker, mission_row
from worker.db.tables import agents, missions
from worker.schedule import next_run_after

HOURLY = "0 * * * *"


async def database_now(db: AsyncEngine) -> datetime:
    async with db.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
    return now


def answer(_request: Any) -> Any:
    return final_answer("Done.")


@pytest.mark.parametrize("skew", [timedelta(minutes=-10), timedelta(minutes=10)])
async def test_a_worker_with_a_skewed_clock_runs_a_due_mission_once_and_schedules_by_the_database(
    db: AsyncEngine, skew: timedelta
) -> None:
    mission_id = await add_mission(db, cron="*/5 * * * *")
    worker = make_worker(db, FunctionChatModel(answer), clock=lambda: datetime.now(UTC) + skew)
    before = await database_now(db)
    assert await worker.run_once() == ["succeeded"]
    after = await database_now(db)
    for _ in range(3):  # nothing is due again: no claim spins
        assert await worker.run_once() == []
    assert len(await iterations(db)) == 1
    next_run = (await mission_row(db, mission_id))["next_run_at"]
    assert next_run in {
        next_run_after("*/5 * * * *", "UTC", before),
        next_run_after("*/5 * * * *", "UTC", after),
    }


async def missed_by(db: AsyncEngine, mission_id: int, late: timedelta, **changes: Any) -> datetime:
    """Make ``mission_id`` due ``late`` ago on the database's clock (at a whole hour for an
    hourly cron); the time it is due at."""
    now = await database_now(db)
    due = (now - late).replace(minute=0, second=0, microsecond=0)
    async with db.begin() as conn:
        await conn.execute(
            update(missions).where(missions.c.id == mission_id).values(next_run_at=due, **changes)
        )
    return due


async def run_until_idle(db: AsyncEngine, limit: int = 30) -> list[str]:
    worker = make_worker(db, FunctionChatModel(answer))
    outcomes: list[str] = []
    for _ in range(limit):
        ran = await worker.run_once()
        if not ran:
            return outcomes
        outcomes += ran
    raise AssertionError(f"still running after {limit} ticks: {outcomes}")


def skipped_count() -> float:
    return REGISTRY.get_sample_value("mana_ai_missed_runs_total", {"catch_up": "skip"}) or 0.0


async def test_skip_runs_no_missed_run_and_goes_on_from_now(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=HOURLY)
    await missed_by(db, mission_id, timedelta(hours=3), catch_up="skip")
    counted = skipped_count()
    assert await run_until_idle(db) == ["skipped"]
    assert await iterations(db) == []  # nothing ran, nothing was started
    now = await database_now(db)
    assert (await mission_row(db, mission_id))["next_run_at"] == next_run_after(HOURLY, "UTC", now)
    assert skipped_count() == counted + 1


async def test_skip_still_runs_a_run_that_is_late_by_less_than_a_minute(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=HOURLY)
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(catch_up="skip", next_run_at=func.now() - text("interval '20 seconds'"))
        )
    assert await run_until_idle(db) == ["succeeded"]


async def test_once_runs_the_missed_runs_once(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=HOURLY)
    await missed_by(db, mission_id, timedelta(hours=5))
    assert await run_until_idle(db) == ["succeeded"]
    now = await database_now(db)
    assert (await mission_row(db, mission_id))["next_run_at"] == next_run_after(HOURLY, "UTC", now)


async def test_all_runs_each_missed_run_within_its_window_oldest_first(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=HOURLY)
    due = await missed_by(
        db, mission_id, timedelta(hours=6), catch_up="all", catch_up_window=timedelta(hours=3)
    )
    now = await database_now(db)
    outcomes = await run_until_idle(db)
    ran = [it["scheduled_for"] for it in sorted(await iterations(db), key=lambda i: i["id"])]
    # the hours within the last 3 hours, oldest first; the three before them are dropped
    expected = [
        due + timedelta(hours=h)
        for h in range(7)
        if now - timedelta(hours=3) < due + timedelta(hours=h) <= now
    ]
    assert ran == expected and outcomes == ["skipped", *["succeeded"] * len(expected)]
    assert (await mission_row(db, mission_id))["next_run_at"] == next_run_after(HOURLY, "UTC", now)


async def test_all_stops_catching_up_when_the_agents_budget_is_used_up(db: AsyncEngine) -> None:
    mission_id = await add_mission(db, cron=HOURLY)
    async with db.begin() as conn:  # each run costs 15 tokens (the scripted reply's usage)
        await conn.execute(update(agents).values(max_tokens_per_day=30))
    await missed_by(db, mission_id, timedelta(hours=12), catch_up="all")
    outcomes = await run_until_idle(db)
    assert outcomes[:2] == ["succeeded", "succeeded"]
    assert outcomes[2:] == ["failed"]  # the budget is used up: the rest are dropped at once
    [*_, last] = sorted(await iterations(db), key=lambda i: i["id"])
    assert last["stop_reason"] == "budget_exhausted" and "dropped" in last["error"]
    now = await database_now(db)
    assert (await mission_row(db, mission_id))["next_run_at"] == next_run_after(HOURLY, "UTC", now)
