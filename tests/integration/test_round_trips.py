"""The round trips of a durable run, counted at the wire (``bench/round_trips.py``): a run of
three write rounds needs at most 20 in all, and no phase more than its budget (claim 1; per
write round: the gate's reservation with the journal's start 1, the tool's own write in one
transaction with its call's record 4, the checkpoint with the outcome 1; finish 1). A count,
not a timing: one more statement anywhere in the path fails here. And the one statement
``notes_create`` makes keeps its promise of one note per call when two attempts at the call
race."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.round_trips import GOAL, PHASE_BUDGET, measure
from planner import ToolContext
from worker.db.tables import notes, policy_call_events
from worker.tools import builtin_tools


@pytest.mark.parametrize("gate", [True, False], ids=["enforce-with-ledger", "no-gate"])
async def test_a_durable_run_of_three_write_rounds_stays_within_its_round_trips(
    db: AsyncEngine, database_url: str, gate: bool
) -> None:
    cold, warm = await measure(database_url, rounds=3, gate=gate)

    figures = f"claim {warm.claim}, rounds {list(warm.rounds)}, finish {warm.finish}"
    assert (cold.outcome, warm.outcome) == ("succeeded", "succeeded")
    assert warm.connections == 0, "the measured run opened a connection: warm-up missed it"
    assert warm.total <= GOAL, f"{warm.total} round trips: {figures}"
    assert warm.claim <= PHASE_BUDGET["claim"], figures
    assert all(n <= PHASE_BUDGET["round"] for n in warm.rounds), figures
    assert warm.finish <= PHASE_BUDGET["finish"], figures
    async with db.connect() as conn:
        made = (await conn.execute(select(func.count()).select_from(notes))).scalar_one()
        slots = (
            await conn.execute(select(func.count()).select_from(policy_call_events))
        ).scalar_one()
    assert made == 6  # 3 per run: each write ran once
    assert slots == (6 if gate else 0)  # with the gate, every write reserved its slot


async def test_notes_create_returns_the_note_an_attempt_committed_while_it_ran(
    db: AsyncEngine,
) -> None:
    """The other attempt's note commits after ``notes_create``'s statement took its snapshot
    (the insert waits on it, then does nothing): the note is read again, not made twice."""
    create = {t.name: t for t in builtin_tools(db)}["notes_create"].handler
    ctx = ToolContext(user_id="alice", iteration_id=9).for_call(1, 0)
    async with db.connect() as other:
        first = (
            await other.execute(
                insert(notes)
                .values(
                    user_id="alice", title="first", body="", idempotency_key=ctx.idempotency_key
                )
                .returning(notes.c.id)
            )
        ).scalar_one()
        racing = asyncio.ensure_future(create({"title": "second"}, ctx))
        async with db.connect() as watcher:
            for _ in range(500):
                waiting = (
                    await watcher.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND datname = current_database()"
                        )
                    )
                ).scalar_one()
                await watcher.rollback()
                if waiting:
                    break
                await asyncio.sleep(0.01)
        assert waiting, "notes_create never waited on the other attempt's note"
        await other.commit()
    made = await racing
    assert (made["id"], made["title"]) == (first, "first")
    async with db.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(notes))).scalar_one() == 1
