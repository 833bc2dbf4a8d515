"""Round trips of one durable run: how many times a worker waits on PostgreSQL for a mission
of three write rounds, counted at the wire.

Not a test: it prints figures (``tests/integration/test_round_trips.py`` holds the same count
to its budget). Usage::

    python bench/round_trips.py [--rounds 3] [--gate enforce|off|both]

The mission's scripted model (``planner.testing.ScriptedChatModel``) calls ``notes_create``
(a built-in ``write`` tool, journaled) once per round for ``--rounds`` rounds, then answers.
It runs through the real tick, runner, journal, stores and tools, on a worker whose engine
reaches PostgreSQL through ``bench.common.RoundTripCounter`` (every Sync and simple Query
the worker sends: BEGIN and COMMIT count, a prepare counts apart from its execution). With
``--gate enforce`` the policy gate is on in ``enforce`` with a rate limit, so every write's
slot is reserved in the PostgreSQL ledger; with ``off`` there is no gate.

What is counted: the second of two identical runs on the same worker, whose pool holds one
connection (the first run warms it and its prepared statements, one-time set-up the daemon
pays once per connection, not per run; its count is printed too, as ``cold``). The run is
split where the model is asked (no database traffic then): ``claim`` is the tick up to the
first request (claiming the mission and starting its iteration), ``round N`` everything from the Nth
request to the next (the gate, the journal, the tool's own write, the round's checkpoint),
``finish`` the rest (storing the outcome, the next run and the lease's release). The budget
is ``claim 1 + per write round (gate + journal start 1, the tool's write 1, checkpoint 1) +
finish 1``: 11 for three rounds, within the goal of 12.

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a throw-away database in that server), else
an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RoundTripCounter, at_least, database_server, throwaway_database
from planner import CompletionRequest, CompletionResponse
from planner.policy import PolicyConfig, PolicyMode, RateLimit
from planner.testing import ScriptedChatModel, ScriptStep, final_answer, tool_calls
from worker.daemon.worker import Worker
from worker.db.engine import create_engine
from worker.db.migrate import upgrade_database
from worker.db.tables import agents, missions
from worker.policy_setup import PolicySetup
from worker.run.runner import MissionRunner
from worker.store.ledger import PostgresCallLedger
from worker.store.postgres import PostgresMissionStore
from worker.tools import builtin_tools

__all__ = ["GOAL", "PHASE_BUDGET", "RoundTrips", "budget", "measure"]

LEASE = timedelta(seconds=60)
RATE_LIMIT = RateLimit(calls=1000, window=timedelta(seconds=60))
"""High enough never to refuse a call here; set, so that every write reserves a slot."""


PHASE_BUDGET = {"claim": 1, "round": 6, "finish": 1}
"""Round trips each phase may need: the claim 1; a write round 6 (the gate's reservation
with the journal's start of the call 1; the tool's own write in one transaction with its
call's record, so that its outcome is never unknown after a crash 4: BEGIN, the write, the
record under the lease, COMMIT; the checkpoint with the call's outcome 1); the finish 1."""

GOAL = 20
"""What a durable run of three write rounds must need at most, in all (the phases' budget
sums to 20). Before a built-in write committed with its record (issue 31), 12: the three
round trips more per write are a fraction of a millisecond each, against a model's 0.2-5 s
per round."""


def budget(rounds: int) -> int:
    """The round trips a run of ``rounds`` write rounds may need (``PHASE_BUDGET``)."""
    return PHASE_BUDGET["claim"] + PHASE_BUDGET["round"] * rounds + PHASE_BUDGET["finish"]


@dataclass(frozen=True)
class RoundTrips:
    """One run's round trips at the wire, by phase (see the module docstring)."""

    claim: int
    rounds: tuple[int, ...]
    finish: int
    connections: int
    """Connections the worker opened during the run (their set-up is in the figures)."""
    outcome: str

    @property
    def total(self) -> int:
        return self.claim + sum(self.rounds) + self.finish


def scripted_run(counter: RoundTripCounter, rounds: int, marks: list[int]) -> ScriptedChatModel:
    """``rounds`` rounds of one ``notes_create`` each, then an answer; every request appends
    the round trips so far to ``marks``."""

    def marked(response: CompletionResponse) -> ScriptStep:
        def step(_request: CompletionRequest) -> CompletionResponse:
            marks.append(counter.round_trips)
            return response

        return step

    steps = [
        marked(tool_calls(("notes_create", {"title": f"note {n}", "body": "counted"})))
        for n in range(1, rounds + 1)
    ]
    return ScriptedChatModel([*steps, marked(final_answer("Saved."))])


async def add_mission(setup_url: str, agent_id: int) -> None:
    """A one-shot mission of ``agent_id``, due now."""
    engine = create_engine(setup_url, pool_size=1, max_overflow=0)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(missions).values(
                    agent_id=agent_id,
                    objective="Write the notes.",
                    cron=None,
                    timezone="UTC",
                    next_run_at=datetime.now(UTC) - timedelta(seconds=1),
                )
            )
    finally:
        await engine.dispose()


async def ensure_agent(setup_url: str) -> int:
    """The id of the agent ``round-trips`` (owner ``u1``), added when missing."""
    engine = create_engine(setup_url, pool_size=1, max_overflow=0)
    try:
        async with engine.begin() as conn:
            found = (
                await conn.execute(select(agents.c.id).where(agents.c.name == "round-trips"))
            ).scalar()
            if found is not None:
                return int(found)
            return int(
                (
                    await conn.execute(
                        insert(agents)
                        .values(name="round-trips", owner_user_id="u1", system_prompt="Be brief.")
                        .returning(agents.c.id)
                    )
                ).scalar_one()
            )
    finally:
        await engine.dispose()


async def measure(url: str, *, rounds: int = 3, gate: bool = True) -> tuple[RoundTrips, RoundTrips]:
    """Run two identical missions of ``rounds`` write rounds, one after the other, on one
    worker whose engine goes through a ``RoundTripCounter`` to the migrated database at
    ``url``, the policy gate in ``enforce`` with the PostgreSQL ledger when ``gate``;
    ``(cold, warm)``: the first run's round trips and the second's."""
    agent_id = await ensure_agent(url)
    async with RoundTripCounter(url) as counter:
        engine = create_engine(counter.url(), pool_size=1, max_overflow=0)
        try:
            store = PostgresMissionStore(engine)
            tools = builtin_tools(engine)
            policy = (
                PolicySetup(
                    default_mode=PolicyMode.ENFORCE,
                    config=PolicyConfig(rate_limit=RATE_LIMIT),
                    ledger=PostgresCallLedger(engine),
                )
                if gate
                else None
            )
            runs = []
            for _ in range(2):
                await add_mission(url, agent_id)
                marks: list[int] = []
                runner = MissionRunner(
                    store=store,
                    llm=scripted_run(counter, rounds, marks),
                    tools_for=lambda m: tools,
                    worker_id="bench",
                    lease=LEASE,
                    policy=policy,
                )
                worker = Worker(
                    store=store,
                    runner=runner,
                    worker_id="bench",
                    max_concurrent_missions=1,
                    lease=LEASE,
                )
                before, connections = counter.round_trips, counter.connections
                [outcome] = await worker.run_once()
                after = counter.round_trips
                if len(marks) != rounds + 1:
                    raise RuntimeError(f"the run ended {outcome} after {len(marks)} request(s)")
                runs.append(
                    RoundTrips(
                        claim=marks[0] - before,
                        rounds=tuple(b - a for a, b in itertools.pairwise(marks)),
                        finish=after - marks[-1],
                        connections=counter.connections - connections,
                        outcome=outcome,
                    )
                )
        finally:
            await engine.dispose()
    cold, warm = runs
    return cold, warm


def report(label: str, rounds: int, cold: RoundTrips, warm: RoundTrips) -> None:
    limit = budget(rounds)
    verdict = "within" if warm.total <= limit else "OVER"
    print(f"policy gate           {label}")
    print(f"outcome               {warm.outcome}")
    print(f"round trips           {warm.total}  ({verdict} the budget of {limit})")
    if rounds == 3:
        met = "met" if warm.total <= GOAL else "NOT met"
        print(f"goal <= {GOAL}            {met}")
    print(f"  claim               {warm.claim}  (budget {PHASE_BUDGET['claim']})")
    for n, count in enumerate(warm.rounds, start=1):
        print(f"  {f'round {n}':<20}{count}  (budget {PHASE_BUDGET['round']})")
    print(f"  finish              {warm.finish}  (budget {PHASE_BUDGET['finish']})")
    print(f"connections opened    {warm.connections}")
    print(
        f"cold                  {cold.total}  (the first run: claim {cold.claim}, rounds "
        f"{'/'.join(map(str, cold.rounds))}, finish {cold.finish}; {cold.connections} "
        "connection(s) set up, statements prepared)"
    )


async def bench(server_url: str, rounds: int, gates: list[bool]) -> bool:
    ok = True
    for gate in gates:
        async with throwaway_database(server_url) as url:
            setup = create_engine(url, pool_size=1, max_overflow=0)
            try:
                await upgrade_database(setup)
            finally:
                await setup.dispose()
            cold, warm = await measure(url, rounds=rounds, gate=gate)
        print()
        report("enforce, PostgreSQL ledger, rate limit set" if gate else "off", rounds, cold, warm)
        ok = ok and warm.total <= budget(rounds)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--rounds", type=at_least(1), default=3, help="write rounds (one notes_create each)"
    )
    parser.add_argument(
        "--gate",
        choices=("enforce", "off", "both"),
        default="both",
        help="the policy gate: enforce (with the PostgreSQL ledger and a rate limit), off, "
        "or one run of each",
    )
    args = parser.parse_args()
    gates = {"enforce": [True], "off": [False], "both": [True, False]}[args.gate]
    print("counted               every Sync and simple Query the worker sends (BEGIN and COMMIT")
    print("                      included), in the second of two identical runs (the first warms")
    print("                      the connection and the prepared statements)")
    with database_server() as (server_url, where):
        print(f"database              {where}")
        ok = asyncio.run(bench(server_url, args.rounds, gates))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
