"""``worker.run.answers.await_answer``: a statement a run sent is not cut off when the run is
cancelled (a shutdown): it gets a few seconds to answer, and the cancellation goes on."""

from __future__ import annotations

import asyncio

import pytest

from worker.run.answers import await_answer


async def test_a_statement_that_answers_gives_its_answer_or_its_error() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 7

    async def refuse() -> int:
        await asyncio.sleep(0)
        raise ValueError("refused")

    assert await await_answer(answer()) == 7
    with pytest.raises(ValueError, match="refused"):
        await await_answer(refuse())


async def test_a_cancelled_caller_waits_for_the_statement_then_is_cancelled() -> None:
    sent = asyncio.Event()
    go_on = asyncio.Event()
    committed: list[str] = []

    async def statement() -> str:
        sent.set()
        await go_on.wait()
        committed.append("yes")
        return "stored"

    task = asyncio.ensure_future(statement())
    caller = asyncio.create_task(await_answer(task, within_s=10))
    await sent.wait()
    caller.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not caller.done()  # waiting for the answer
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert committed == ["yes"] and task.result() == "stored"


async def test_a_statement_that_does_not_answer_in_time_is_cancelled() -> None:
    never = asyncio.Event()

    async def statement() -> None:
        await never.wait()

    task = asyncio.ensure_future(statement())
    caller = asyncio.create_task(await_answer(task, within_s=0.01))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert task.cancelled()


async def test_a_statement_that_fails_after_the_cancellation_is_still_a_cancellation() -> None:
    async def statement() -> None:
        await asyncio.sleep(0.01)
        raise ConnectionResetError("reset")

    task = asyncio.ensure_future(statement())
    caller = asyncio.create_task(await_answer(task, within_s=10))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert isinstance(task.exception(), ConnectionResetError)


async def test_a_second_cancellation_does_not_cut_the_wait_short() -> None:
    go_on = asyncio.Event()

    async def statement() -> str:
        await go_on.wait()
        return "stored"

    task = asyncio.ensure_future(statement())
    caller = asyncio.create_task(await_answer(task, within_s=10))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0.01)
    caller.cancel()  # asked again to stop
    await asyncio.sleep(0.01)
    assert not caller.done()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert task.result() == "stored"
