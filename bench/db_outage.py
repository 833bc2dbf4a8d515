"""Database outages: what a worker loses when PostgreSQL's connections are cut under it.

Not a test: it prints figures. Usage::

    python bench/db_outage.py [--scenario blip|outages] [--missions N] [--outage-s S]
                              [--concurrency C] [--lease-s L]

Each mission is one-shot: it writes a note (``notes_create``, a journaled write) and then
answers. The worker is wired from settings as ``mana-ai worker`` is
(``worker.daemon.app.open_app``), with a scripted model in process, and reaches PostgreSQL
through a proxy that cuts every connection and refuses new ones during an outage
(``tests.fakes.db_proxy.FlakyProxy``).

* ``blip`` (default 12 missions, all at once): once every mission wrote its note, the
  database goes away for ``--outage-s`` (0.5 s) while the model writes its final answers; the
  answers arrive 10-60 ms before it is back, so every run's final store meets the outage.
* ``outages`` (default 100 missions, 20 at a time): two outages of ``--outage-s`` (5 s), the
  first after 15 answers, the second after 60, with missions at every stage.

Prints the iterations by status and stop reason, the missions closed without a succeeded
iteration (lost), the notes written against the missions (each exactly once), whether any
model was told to "try again", and the wall time.

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a throw-away database in that server), else
an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import func, insert, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from planner import CompletionRequest, CompletionResponse
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.fakes.db_proxy import FlakyProxy
from worker.daemon.app import open_app
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import agents, mission_iterations, missions, notes
from worker.settings import load_settings


async def add_missions(url: str, count: int) -> None:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        await upgrade_database(engine)
        async with engine.begin() as conn:
            agent_id = (
                await conn.execute(
                    insert(agents)
                    .values(name="writer", owner_user_id="u1", system_prompt="Be brief.")
                    .returning(agents.c.id)
                )
            ).scalar_one()
            due = datetime.now(UTC) - timedelta(seconds=1)
            await conn.execute(
                insert(missions),
                [
                    {
                        "agent_id": agent_id,
                        "objective": f"note {n:04d}",
                        "cron": None,
                        "timezone": "UTC",
                        "next_run_at": due,
                    }
                    for n in range(count)
                ],
            )
    finally:
        await engine.dispose()


def scripted_model(proxy: FlakyProxy, args: argparse.Namespace) -> FunctionChatModel:
    """notes_create with the objective as title, then an answer; outages per scenario."""
    state = {"answered": 0, "told_to_retry": 0}
    barrier = asyncio.Barrier(args.missions) if args.scenario == "blip" else None

    async def answer(request: CompletionRequest) -> CompletionResponse:
        objective = next(m.content or "" for m in request.messages if m.role == "user")
        results = [m.content or "" for m in request.messages if m.role == "tool"]
        if not results:
            return tool_calls(("notes_create", {"title": objective}))
        state["told_to_retry"] += sum("try again" in r for r in results)
        state["answered"] += 1
        if barrier is not None:
            if await barrier.wait() == 0:
                await proxy.outage(args.outage_s)
            number = int(objective.split()[-1])
            await asyncio.sleep(max(0.0, args.outage_s - 0.06 + 0.05 * number / args.missions))
        elif state["answered"] in (15, 60):
            await proxy.outage(args.outage_s)
        return final_answer("Saved.")

    model = FunctionChatModel(answer)
    model.state = state  # type: ignore[attr-defined]
    return model


async def bench(server_url: str, args: argparse.Namespace) -> None:
    async with throwaway_database(server_url) as url, FlakyProxy(url) as proxy:
        await add_missions(url, args.missions)
        reader = create_engine(url, pool_size=1, max_overflow=0)
        settings = load_settings(
            database_url=proxy.url_for(url),
            worker_id="bench",
            metrics_port=0,
            max_concurrent_missions=args.concurrency,
            lease_s=args.lease_s,
            wake_up=False,
        )
        model = scripted_model(proxy, args)
        started = time.perf_counter()
        try:
            async with open_app(settings, llm=model, migrate=False) as app:
                while True:
                    await app.worker.tick_safely()
                    await asyncio.sleep(0.2)
                    async with reader.connect() as conn:
                        finished = (
                            await conn.execute(
                                select(func.count()).where(
                                    mission_iterations.c.status.in_(("succeeded", "failed")),
                                    mission_iterations.c.stop_reason.is_distinct_from(
                                        "interrupted"
                                    ),
                                )
                            )
                        ).scalar_one()
                    if finished >= args.missions and not app.worker.running:
                        break
                    if time.perf_counter() - started > args.timeout_s:
                        print(f"gave up after {args.timeout_s:.0f} s")
                        break
            elapsed = time.perf_counter() - started
            async with reader.connect() as conn:
                its = (
                    await conn.execute(
                        select(
                            mission_iterations.c.status,
                            mission_iterations.c.stop_reason,
                            mission_iterations.c.attempt,
                        )
                    )
                ).all()
                titles = list((await conn.execute(select(notes.c.title))).scalars())
                closed = (
                    await conn.execute(
                        select(func.count())
                        .select_from(missions)
                        .where(
                            missions.c.status == "completed",
                            ~select(mission_iterations.c.id)
                            .where(
                                mission_iterations.c.mission_id == missions.c.id,
                                mission_iterations.c.status == "succeeded",
                            )
                            .exists(),
                        )
                    )
                ).scalar_one()
        finally:
            await reader.dispose()
    by_outcome = collections.Counter(f"{s}/{r}" for s, r, _ in its)
    counts = collections.Counter(titles)
    state = model.state  # type: ignore[attr-defined]
    print(f"scenario              {args.scenario}")
    print(f"missions              {args.missions}  ({args.concurrency} at a time)")
    print(f"outages               {proxy.outages} x {args.outage_s:g} s")
    print(f"iterations            {dict(sorted(by_outcome.items()))}")
    print(f"resumed (attempt > 1) {sum(1 for *_, a in its if a > 1)}")
    print(f"store_failed          {by_outcome.get('failed/store_failed', 0)}")
    print(f"lost                  {closed}  (one-shot missions closed without a success)")
    print(
        f"notes                 {len(titles)} for {args.missions} missions; "
        f"{sum(1 for n in counts.values() if n > 1)} written twice"
    )
    print(f"told_to_try_again     {state['told_to_retry']}")
    print(f"wall_s                {elapsed:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--scenario", choices=("blip", "outages"), default="blip")
    parser.add_argument(
        "--missions", type=at_least(1), default=None, help="default: 12 (blip), 100 (outages)"
    )
    parser.add_argument(
        "--outage-s",
        type=at_least(0.01, float),
        default=None,
        help="each outage; default: 0.5 (blip), 5 (outages)",
    )
    parser.add_argument(
        "--concurrency", type=at_least(1), default=None, help="default: every mission (blip), 20"
    )
    parser.add_argument(
        "--lease-s", type=at_least(1.0, float), default=60.0, help="MANA_AI_LEASE_S"
    )
    parser.add_argument("--timeout-s", type=at_least(1.0, float), default=300.0)
    args = parser.parse_args()
    blip = args.scenario == "blip"
    args.missions = args.missions or (12 if blip else 100)
    args.outage_s = args.outage_s or (0.5 if blip else 5.0)
    args.concurrency = args.concurrency or (args.missions if blip else 20)
    with database_server() as (server_url, where):
        print(f"database              {where}")
        asyncio.run(bench(server_url, args))


if __name__ == "__main__":
    main()
