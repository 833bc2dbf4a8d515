"""Claiming ahead (``MissionRunner.run(claim_ahead=...)``, ``MissionStore.end_run`` with a
``ClaimOrder``): with more missions due than slots, a run's finish claims the mission that
takes its slot in the same step, so a mission costs one store step instead of a finish and a
claim; never more missions at once than the worker's slots, never the finishing mission
itself, nothing left leased and not run when a finish fails or the worker stops. The
in-memory store, whose ``calls`` count its steps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from planner import CompletionRequest, CompletionResponse, TokenUsage
from planner.testing import FunctionChatModel, final_answer
from tests.backlog import run_until_stored
from worker.daemon.worker import Worker
from worker.db.statuses import IterationStatus, MissionStatus
from worker.run.runner import MissionRunner, RunOutcome, RunResult
from worker.store.memory import InMemoryMissionStore
from worker.store.records import ClaimOrder, EndResult, Finished, IterationOutcome

LEASE = timedelta(seconds=60)


class Answers:
    """The model: answers at once after a pause, and notes the most missions leased to the
    worker, and the most runs asking, at any one time."""

    def __init__(self, store: InMemoryMissionStore) -> None:
        self.store = store
        self.asking = 0
        self.most_asking = 0
        self.most_leased = 0

    async def __call__(self, request: CompletionRequest) -> CompletionResponse:
        self.asking += 1
        self.most_asking = max(self.most_asking, self.asking)
        leased = sum(m["lease_owner"] == "w1" for m in self.store.missions.values())
        self.most_leased = max(self.most_leased, leased)
        await asyncio.sleep(0.001)
        self.asking -= 1
        return final_answer("Done.")


def worker_on(
    store: InMemoryMissionStore,
    llm: Any,
    *,
    slots: int,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Worker:
    """A worker of ``slots`` slots running missions of ``store`` with the model ``llm`` (a
    function of the request, as ``FunctionChatModel`` takes it) and no tools."""
    runner = MissionRunner(
        store=store,
        llm=FunctionChatModel(llm),
        tools_for=lambda m: [],
        worker_id="w1",
        lease=LEASE,
        clock=clock,
    )
    return Worker(
        store=store, runner=runner, worker_id="w1", max_concurrent_missions=slots, lease=LEASE
    )


def backlog(
    missions: int, *, slots: int, store: InMemoryMissionStore | None = None
) -> tuple[InMemoryMissionStore, Worker, Answers]:
    store = store or InMemoryMissionStore()
    agent_id = store.add_agent("a1")
    for _ in range(missions):
        store.add_mission(agent_id)
    answers = Answers(store)
    worker = worker_on(store, answers, slots=slots)
    return store, worker, answers


def finished(store: InMemoryMissionStore) -> list[dict[str, Any]]:
    return [it for it in store.iterations.values() if it["finished_at"] is not None]


async def test_a_backlog_is_claimed_by_the_finishes_one_step_per_mission() -> None:
    store, worker, answers = backlog(12, slots=3)
    await run_until_stored(worker, 12)
    assert [it["status"] for it in finished(store)] == ["succeeded"] * 12
    assert all(m["status"] == "completed" for m in store.missions.values())
    # the first tick claimed 3 and every other mission came with a finish; the finishes whose
    # claim came back short (the backlog ran out) wake ticks for their slots
    assert store.calls["claim_due"] <= 1 + 3 and store.calls["end_run"] == 12
    assert answers.most_asking == 3 and answers.most_leased == 3


async def test_a_worker_with_a_free_slot_left_claims_nothing_with_its_finishes() -> None:
    store, worker, _ = backlog(2, slots=3)  # the first claim did not fill the slots
    end_run = store.end_run
    orders: list[ClaimOrder | None] = []

    async def noted(*args: Any, claim: ClaimOrder | None = None, **kwargs: Any) -> EndResult:
        orders.append(claim)
        return await end_run(*args, claim=claim, **kwargs)

    store.end_run = noted  # type: ignore[method-assign]
    await run_until_stored(worker, 2)
    assert orders == [None, None]


async def test_a_one_shot_tick_runs_only_what_it_claimed() -> None:
    store, worker, _ = backlog(5, slots=2)
    assert await worker.run_once() == ["succeeded", "succeeded"]
    waiting = [m for m in store.missions.values() if m["status"] == "active"]
    assert len(waiting) == 3 and all(m["lease_owner"] is None for m in waiting)
    assert len(store.iterations) == 2


async def test_a_failed_finish_leaves_its_slots_to_the_tick_and_loses_nothing() -> None:
    store, worker, answers = backlog(9, slots=3)
    store.fail_next(ConnectionResetError("reset"), times=4, methods={"end_run"})
    await run_until_stored(worker, 9)
    assert [it["status"] for it in finished(store)] == ["succeeded"] * 9
    assert all(m["lease_owner"] is None for m in store.missions.values())
    assert answers.most_leased <= 3 and store.calls["claim_due"] >= 2


async def test_a_finish_never_claims_the_mission_it_finishes() -> None:
    store = InMemoryMissionStore()
    agent_id = store.add_agent("a1")
    mission_id = store.add_mission(agent_id, cron="* * * * *")
    [mission] = await store.claim_due(worker_id="w1", limit=1, lease=LEASE)
    assert mission.iteration is not None
    store.missions[mission_id]["lease_expires_at"] = datetime.now(UTC) - timedelta(seconds=1)
    order = ClaimOrder(limit=5, lease=LEASE)
    due_again = datetime.now(UTC) - timedelta(seconds=1)
    outcome = IterationOutcome(
        status=IterationStatus.SUCCEEDED,
        messages=[],
        rounds=1,
        prompt_tokens=0,
        completion_tokens=0,
        stop_reason=None,
        error=None,
        next_run_at=due_again,
        mission_status=MissionStatus.ACTIVE,
    )
    stored = await store.end_run(
        mission, Finished(mission.iteration.id, 1, outcome), worker_id="w1", claim=order
    )
    assert stored.lease_held and stored.claimed == ()
    assert store.missions[mission_id]["lease_owner"] is None  # due, for the next claim
    [again] = await store.claim_due(worker_id="w1", limit=5, lease=LEASE)
    assert again.id == mission_id and again.scheduled_for == due_again


class HeldFinish(InMemoryMissionStore):
    """The first finish that claims waits for ``release`` once it has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.begun = asyncio.Event()
        self.release = asyncio.Event()

    async def end_run(self, *args: Any, claim: Any = None, **kwargs: Any) -> EndResult:
        if claim is not None and not self.begun.is_set():
            self.begun.set()
            await self.release.wait()
        return await super().end_run(*args, claim=claim, **kwargs)


def ticking(worker: Worker) -> AsyncIOScheduler:
    """``worker`` ticking as the daemon has it (a tick an hour: the first one, then wake-ups
    and finishes claim)."""
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, 3600)
    scheduler.start()
    return scheduler


async def test_a_mission_a_finish_claimed_as_the_worker_stopped_is_run_within_the_grace() -> None:
    store, worker, _ = backlog(3, slots=1, store=HeldFinish())
    scheduler = ticking(worker)
    async with asyncio.timeout(10):
        await store.begun.wait()  # the first mission's finish, claiming the second
        draining = asyncio.create_task(worker.drain(10))
        await asyncio.sleep(0)  # the stop is in
        assert worker.stopping
        store.release.set()
        await draining
        scheduler.shutdown(wait=False)
    # the second mission was claimed before the stop: it ran; the third was never claimed
    assert [it["status"] for it in finished(store)] == ["succeeded", "succeeded"]
    assert not worker.running
    third = [m for m in store.missions.values() if m["status"] == "active"]
    assert len(third) == 1 and third[0]["lease_owner"] is None


async def test_a_stop_at_once_waits_for_a_claiming_finish_and_leaves_nothing_leased() -> None:
    """A zero grace (or a second signal) cancels the run whose finish is claiming: the
    statement goes on (sent, it would commit anyway), what it claimed is started and
    interrupted like every run, and no mission is left leased until its lease expires."""
    store, worker, _ = backlog(3, slots=1, store=HeldFinish())
    scheduler = ticking(worker)
    async with asyncio.timeout(10):
        await store.begun.wait()  # the first mission's finish, claiming the second
        draining = asyncio.create_task(worker.drain(0))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not draining.done()  # the cancelled run waits for its statement
        store.release.set()
        await draining
        scheduler.shutdown(wait=False)
    runs = sorted(store.iterations.values(), key=lambda it: it["mission_id"])
    assert [(it["status"], it["stop_reason"]) for it in runs] == [
        ("succeeded", "final_answer"),
        ("failed", "interrupted"),  # claimed by the finish, interrupted by the stop
    ]
    assert all(m["lease_owner"] is None for m in store.missions.values())
    assert not worker.running


async def test_a_run_a_finish_started_as_the_stop_came_begins_before_it_is_interrupted() -> None:
    """The stop's first look at the runs comes between a finish's claim starting a run and
    that run's first step: cancelled then, the run could not record anything."""
    store, worker, _ = backlog(3, slots=1)
    settling = asyncio.Event()
    end_run = store.end_run

    async def noted(*args: Any, **kwargs: Any) -> EndResult:
        ended = await end_run(*args, **kwargs)
        if ended.claimed:
            settling.set()  # wakes the test before the claimed run's first step
        return ended

    store.end_run = noted  # type: ignore[method-assign]
    scheduler = ticking(worker)
    async with asyncio.timeout(10):
        await settling.wait()
        await worker.drain(0)
        scheduler.shutdown(wait=False)
    assert all(m["lease_owner"] is None for m in store.missions.values())
    statuses = sorted((it["status"], it["stop_reason"]) for it in store.iterations.values())
    assert statuses == [("failed", "interrupted"), ("succeeded", "final_answer")]


async def test_a_mission_claimed_by_a_finish_counts_that_run_toward_the_daily_budget() -> None:
    store = InMemoryMissionStore()
    agent_id = store.add_agent("a1", max_tokens_per_day=50)
    first, second = store.add_mission(agent_id), store.add_mission(agent_id)
    costly = final_answer("Done.", usage=TokenUsage(prompt_tokens=55, completion_tokens=5))
    worker = worker_on(store, lambda request: costly, slots=1)
    end_run = store.end_run
    claimed_by_finishes: list[int] = []

    async def noted(*args: Any, **kwargs: Any) -> EndResult:
        stored = await end_run(*args, **kwargs)
        claimed_by_finishes.extend(m.id for m in stored.claimed)
        return stored

    store.end_run = noted  # type: ignore[method-assign]
    await run_until_stored(worker, 2)
    assert claimed_by_finishes == [second]  # it came with the first one's finish
    runs = {it["mission_id"]: it for it in finished(store)}
    assert runs[first]["status"] == "succeeded"
    assert (runs[second]["status"], runs[second]["stop_reason"]) == ("failed", "budget_exhausted")


class SlowSecondClaim(InMemoryMissionStore):
    """The second ``claim_due`` (a wake-up tick's) is under way until the second finish has
    been stored: ``claim_begun`` is set when it begins."""

    def __init__(self) -> None:
        super().__init__()
        self.claims = self.finishes = 0
        self.claim_begun = asyncio.Event()
        self.second_finished = asyncio.Event()

    async def claim_due(self, **kwargs: Any) -> list[Any]:
        self.claims += 1
        if self.claims == 2:
            self.claim_begun.set()
            await self.second_finished.wait()
        return await super().claim_due(**kwargs)

    async def end_run(self, *args: Any, **kwargs: Any) -> EndResult:
        stored = await super().end_run(*args, **kwargs)
        self.finishes += 1
        if self.finishes == 2:
            self.second_finished.set()
        return stored


async def test_a_ticks_claim_under_way_holds_its_slots_from_a_finishs_claim() -> None:
    store = SlowSecondClaim()
    agent_id = store.add_agent("a1")
    now = datetime.now(UTC)
    # the first mission is past its deadline: its run ends at once, claiming nothing, and
    # the slot it frees wakes a tick; the second's finish claims while that tick's claim is
    # under way, and must not take that slot too
    store.add_mission(agent_id, next_run_at=now - timedelta(seconds=9), deadline=now)
    for age in range(8, 3, -1):
        store.add_mission(agent_id, next_run_at=now - timedelta(seconds=age))
    answers = Answers(store)

    async def answer(request: CompletionRequest) -> CompletionResponse:
        await store.claim_begun.wait()  # the second mission ends once the tick's claim began
        return await answers(request)

    worker = worker_on(store, answer, slots=2)
    await run_until_stored(worker, 6)
    assert answers.most_leased <= 2 and answers.most_asking <= 2
    assert [it["status"] for it in finished(store)] == ["succeeded"] * 5


async def test_a_run_whose_next_run_is_due_when_it_ends_runs_again_at_once() -> None:
    """Without wake-ups from the database (PgBouncer): the finish's claim cannot take its own
    mission, so the worker ticks for it."""
    reads = 0

    def clock() -> datetime:  # the first claim reads an hour ago: its run outlasts its period
        nonlocal reads
        reads += 1
        return datetime.now(UTC) - (timedelta(hours=1) if reads <= 2 else timedelta(0))

    store = InMemoryMissionStore(clock=clock)  # the database's clock, which schedules
    store.add_mission(store.add_agent("a1"), cron="* * * * *")
    worker = worker_on(store, lambda request: final_answer("Done."), slots=1)
    await run_until_stored(worker, 2)
    [mission] = store.missions.values()
    assert len(store.iterations) == 2 and mission["next_run_at"] > datetime.now(UTC)


class Runs:
    """Stands in for the runner: each run waits until ``end(mission id)``, claiming nothing."""

    default_model = None

    def __init__(self) -> None:
        self.ends: dict[int, asyncio.Event] = {}

    async def run(self, mission: Any, *, claim_ahead: int = 0) -> RunResult:
        await self.ends.setdefault(mission.id, asyncio.Event()).wait()
        return RunResult(RunOutcome.SUCCEEDED)

    def end(self, mission_id: int) -> None:
        self.ends.setdefault(mission_id, asyncio.Event()).set()


class Claims:
    """Stands in for the store: the n-th ``claim_due`` waits for ``release[n]`` when there is
    one, then gives the missions of ``batches[n]``; ``limits`` are the limits asked for."""

    def __init__(self, batches: list[list[int]], release: dict[int, asyncio.Event]) -> None:
        self.batches = batches
        self.release = release
        self.limits: list[int] = []
        self.begun: dict[int, asyncio.Event] = {n: asyncio.Event() for n in range(len(batches))}

    async def claim_due(self, *, limit: int, **_: Any) -> list[Any]:
        n = len(self.limits)
        self.limits.append(limit)
        self.begun[n].set()
        if n in self.release:
            await self.release[n].wait()
        return [SimpleNamespace(id=i) for i in self.batches[n]] if n < len(self.batches) else []


async def test_a_slot_freed_while_a_ticks_claim_is_under_way_is_claimed_right_after_it() -> None:
    release = {1: asyncio.Event()}
    claims = Claims([[1, 2], [3], [4]], release)
    runs = Runs()
    worker = Worker(
        store=claims,  # type: ignore[arg-type]
        runner=runs,  # type: ignore[arg-type]
        worker_id="w1",
        max_concurrent_missions=2,
        lease=LEASE,
    )
    scheduler = ticking(worker)
    async with asyncio.timeout(10):
        await claims.begun[0].wait()
        await asyncio.sleep(0)  # the first tick starts its two runs
        runs.end(1)  # a slot frees: a tick claims for it, and its claim is slow
        await claims.begun[1].wait()
        runs.end(2)  # another slot frees while that claim is under way
        await asyncio.sleep(0)
        release[1].set()
        await claims.begun[2].wait()  # the tick right after, not at the interval
    assert claims.limits == [2, 1, 1]
    for mission_id in (3, 4):
        runs.end(mission_id)
    await worker.drain(5)
    scheduler.shutdown(wait=False)
