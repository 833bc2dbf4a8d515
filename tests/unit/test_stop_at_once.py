"""A stop at once (``Worker.drain(0)``: a zero ``MANA_AI_SHUTDOWN_GRACE_S``, a second signal)
leaves no run that began without a record of its end, and ends within seconds even when the
database does not answer: a run resuming a taken-over attempt stores its interruption like
one in its loop, an interruption that gets no answer is given up after ``SHUTDOWN_STORE_S``,
and a tick whose claim gets no answer is not waited for past ``ANSWER_WAIT_S``. The
in-memory store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from planner import CompletionRequest, CompletionResponse
from planner.testing import FunctionChatModel, final_answer
from worker.daemon import worker as worker_module
from worker.daemon.worker import Worker
from worker.run import ending
from worker.run.runner import MissionRunner
from worker.store.memory import InMemoryMissionStore
from worker.store.records import Interrupted

LEASE = timedelta(seconds=60)


def worker_on(store: InMemoryMissionStore, llm: Any, *, worker_id: str) -> Worker:
    run = MissionRunner(
        store=store,
        llm=FunctionChatModel(llm),
        tools_for=lambda m: [],
        worker_id=worker_id,
        lease=LEASE,
    )
    return Worker(
        store=store, runner=run, worker_id=worker_id, max_concurrent_missions=4, lease=LEASE
    )


class Gated(InMemoryMissionStore):
    """``resume_details``, an interruption's ``end_run`` (``interrupt``) or ``claim_due`` wait
    for ``go`` once ``held`` names them (the database does not answer them meanwhile);
    ``cancelled``: one of those waits was cancelled."""

    def __init__(self, *held: str) -> None:
        super().__init__()
        self.held = set(held)
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()
        self.cancelled = False

    async def _gate(self, name: str) -> None:
        if name in self.held:
            self.waiting.set()
            try:
                await self.go.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise

    async def resume_details(self, *args: Any, **kwargs: Any) -> Any:
        await self._gate("resume_details")
        return await super().resume_details(*args, **kwargs)

    async def end_run(self, mission: Any, end: Any, **kwargs: Any) -> Any:
        if isinstance(end, Interrupted):
            await self._gate("interrupt")
        return await super().end_run(mission, end, **kwargs)

    async def claim_due(self, **kwargs: Any) -> list[Any]:
        await self._gate("claim_due")
        return await super().claim_due(**kwargs)


def stuck_model() -> tuple[
    Callable[[CompletionRequest], Awaitable[CompletionResponse]], asyncio.Event
]:
    """A model that never answers, and the event it sets once asked."""
    asking = asyncio.Event()

    async def stuck(request: CompletionRequest) -> CompletionResponse:
        asking.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    return stuck, asking


async def interrupted_runs(store: Gated, count: int) -> None:
    """``count`` missions whose first attempt was interrupted by a stop (resumable)."""
    agent_id = store.add_agent("a1")
    for _ in range(count):
        store.add_mission(agent_id)
    stuck, asking = stuck_model()
    first = worker_on(store, stuck, worker_id="w1")
    await first.tick()
    await asyncio.wait_for(asking.wait(), 5)
    await first.drain(0)
    assert all(m["lease_owner"] is None for m in store.missions.values())


async def test_a_run_resuming_when_the_stop_comes_stores_its_interruption() -> None:
    store = Gated()
    await interrupted_runs(store, 3)
    store.held = {"resume_details"}
    second = worker_on(store, lambda request: final_answer("Done."), worker_id="w2")
    await second.tick()  # takes the three runs over; each reads its checkpoint
    await asyncio.wait_for(store.waiting.wait(), 5)
    await second.drain(0)
    assert all(m["lease_owner"] is None for m in store.missions.values())
    attempts = sorted(
        (it["attempts"][-1]["attempt"], it["status"], it["stop_reason"])
        for it in store.iterations.values()
    )
    assert attempts == [(2, "failed", "interrupted")] * 3  # resumable again by the next one


async def test_an_interruption_the_database_does_not_answer_is_given_up_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ending, "SHUTDOWN_STORE_S", 0.2)
    store = Gated("interrupt")
    store.add_mission(store.add_agent("a1"))
    stuck, asking = stuck_model()
    worker = worker_on(store, stuck, worker_id="w1")
    await worker.tick()
    await asyncio.wait_for(asking.wait(), 5)
    began = time.monotonic()
    await asyncio.wait_for(worker.drain(0), 5)
    assert time.monotonic() - began < 2
    assert not worker.running
    # left to whoever claims it once its lease expires
    [mission] = store.missions.values()
    assert mission["lease_owner"] == "w1"


async def test_a_tick_whose_claim_gets_no_answer_is_not_waited_for_past_the_answer_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_module, "ANSWER_WAIT_S", 0.2)
    store = Gated("claim_due")
    store.add_mission(store.add_agent("a1"))
    worker = worker_on(store, lambda request: final_answer("Done."), worker_id="w1")
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, 3600)
    scheduler.start()
    await asyncio.wait_for(store.waiting.wait(), 5)
    began = time.monotonic()
    await asyncio.wait_for(worker.drain(0), 5)
    assert time.monotonic() - began < 2
    assert not store.cancelled  # the daemon cancels it next (``worker.daemon.serve``): the
    scheduler.shutdown(wait=False)  # scheduler's shutdown cancels the tick in flight
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.cancelled
