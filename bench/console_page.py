"""The console's iteration page: server time to render the timeline of a long iteration.

Not a test: it prints figures. Usage::

    python bench/console_page.py [--rounds 50] [--calls 200] [--requests 200]

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a fresh database is created in that server
and dropped afterwards), else an embedded PostgreSQL in a temporary directory.

It stores one iteration of ``--rounds`` rounds and ``--calls`` tool calls (spread over the
rounds; every other round's calls are reads that ran side by side), each with its policy
decision, a reminder per round and a compaction that folded the first tenth of the rounds,
then asks the console for ``/iterations/ID`` ``--requests`` times, signed in, over the ASGI
app in-process (no socket: what is timed is the server's work: the queries, the replay, the
timeline and the template). It prints p50, p95 and max in milliseconds; the goal is a p95
under 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from worker.api.app import build_app
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import (
    agents,
    compacted_turns,
    mission_iterations,
    missions,
    tool_invocations,
)
from worker.queries.admin_tokens import AdminTokenStore
from worker.settings import Settings
from worker.tools import builtin_tool_catalog

SUMMARY = "<summary of {n} earlier turn(s)>\nThe clock was read; notes were listed and written."


def conversation(rounds: int, calls: int) -> tuple[list[dict], list[dict], list[dict]]:
    """The stored log, the calls' rows and the reminders of a long iteration."""
    per_round = [calls // rounds + (1 if r < calls % rounds else 0) for r in range(rounds)]
    log: list[dict] = [
        {"role": "system", "content": "You keep the notes tidy."},
        {"role": "user", "content": "Tidy the notes and say what you did."},
    ]
    rows: list[dict] = []
    reminders: list[dict] = []
    for r, count in enumerate(per_round, start=1):
        reads = r % 2 == 1
        tool_calls = []
        for p in range(count):
            name = ("clock_now" if p % 2 else "notes_list") if reads else "notes_create"
            args = {} if name == "clock_now" else {"title": f"note {r}.{p}", "body": "x" * 80}
            call_id = f"call_{r}_{p}"
            tool_calls.append({"id": call_id, "name": name, "arguments": args})
            rows.append(
                {
                    "round": r,
                    "position": p,
                    "call_id": call_id,
                    "tool": name,
                    "arguments": args,
                    "result": {"ok": True, "items": list(range(5))},
                    "outcome": "ok",
                    "policy_decision": {
                        "allow": True,
                        "reason": "allowed",
                        "verdict": "allow",
                        "mode": "enforce",
                        "flags": [],
                        "markers": [],
                    },
                    "policy_mode": "enforce",
                    "duration_ms": 3.5,
                }
            )
        log.append(
            {
                "role": "assistant",
                "content": f"Round {r}: working on it.",
                "tool_calls": tool_calls,
                "reply_info": {"finish_reason": "tool_calls", "usage": {"prompt_tokens": 900}},
            }
        )
        for call in tool_calls:
            log.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": json.dumps({"ok": True, "items": list(range(5))}),
                }
            )
        reminders.append(
            {"round": r, "producer": "rounds_left", "text": f"{rounds - r} round(s) left."}
        )
    log.append({"role": "assistant", "content": "The notes are tidy."})
    return log, rows, reminders


async def seed(engine, rounds: int, calls: int) -> int:
    log, rows, reminders = conversation(rounds, calls)
    folded_rounds = max(1, rounds // 10)
    # the first folded_rounds turns (assistant + tool messages) were folded into one summary
    cut = 2
    seen = 0
    while seen < folded_rounds:
        cut += 1
        while cut < len(log) and log[cut]["role"] == "tool":
            cut += 1
        seen += 1
    folded = log[2:cut]
    summary = {"role": "user", "content": SUMMARY.format(n=folded_rounds)}
    stored = [*log[:2], summary, *log[cut:]]
    async with engine.begin() as conn:
        agent = (
            await conn.execute(
                insert(agents)
                .values(name="scribe", owner_user_id="u1", system_prompt="s")
                .returning(agents.c.id)
            )
        ).scalar_one()
        mission = (
            await conn.execute(
                insert(missions)
                .values(agent_id=agent, objective="Tidy the notes.", status="completed")
                .returning(missions.c.id)
            )
        ).scalar_one()
        iteration = (
            await conn.execute(
                insert(mission_iterations)
                .values(
                    mission_id=mission,
                    scheduled_for=time_now(),
                    status="succeeded",
                    worker_id="bench",
                    messages=stored,
                    reminders=reminders,
                    rounds=rounds + 1,
                    prompt_tokens=rounds * 900,
                    completion_tokens=rounds * 50,
                    stop_reason="final_answer",
                )
                .returning(mission_iterations.c.id)
            )
        ).scalar_one()
        await conn.execute(
            insert(tool_invocations),
            [
                {**row, "iteration_id": iteration, "mission_id": mission, "user_id": "u1"}
                for row in rows
            ],
        )
        await conn.execute(
            insert(compacted_turns).values(
                iteration_id=iteration,
                mission_id=mission,
                attempt=1,
                compaction_index=1,
                round=folded_rounds + 1,
                start_index=2,
                folded=folded,
                folded_turns=folded_rounds,
                summary=summary["content"],
                tokens_before=90_000,
                tokens_after=20_000,
            )
        )
    return int(iteration)


def time_now():
    from datetime import UTC, datetime

    return datetime.now(UTC)


async def bench(url: str, rounds: int, calls: int, requests: int) -> list[float]:
    engine = create_engine(url, pool_size=4)
    try:
        await upgrade_database(engine)
        iteration = await seed(engine, rounds, calls)
        _, token = await AdminTokenStore(engine).create_token("bench")
        catalog = builtin_tool_catalog()
        app = build_app(
            engine,
            Settings(database_url=url),
            known_tools=[t.name for t in catalog],
            hints={t.name: t.policy_hint for t in catalog},
        )
        transport = httpx.ASGITransport(app=app)
        base = "http://bench"
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            login = await client.post("/login", data={"token": token}, headers={"Origin": base})
            assert login.status_code == 303, login.text
            first = await client.get(f"/iterations/{iteration}")
            assert first.status_code == 200 and "Compaction 1" in first.text, first.text[:500]
            print(f"page: {len(first.content) / 1024:.0f} KiB of HTML")
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                response = await client.get(f"/iterations/{iteration}")
                times.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200
        return times
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=at_least(2), default=50)
    parser.add_argument("--calls", type=at_least(1), default=200)
    parser.add_argument("--requests", type=at_least(1), default=200)
    args = parser.parse_args()

    async def run() -> list[float]:
        with database_server() as (server, where):
            print(f"database: {where}")
            async with throwaway_database(server) as url:
                return await bench(url, args.rounds, args.calls, args.requests)

    times = sorted(asyncio.run(run()))
    p95 = times[max(0, int(len(times) * 0.95) - 1)]
    print(
        f"iteration page, {args.rounds} rounds and {args.calls} calls, {len(times)} requests: "
        f"p50 {statistics.median(times):.1f} ms, p95 {p95:.1f} ms, max {times[-1]:.1f} ms "
        f"(goal: p95 under 200 ms: {'met' if p95 < 200 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
