"""Waiting for a statement's answer when the run that sent it is cancelled.

A statement sent to PostgreSQL commits whether or not anyone waits for its answer: a run
cancelled while its end is being stored (the worker stopping at once: a zero
``MANA_AI_SHUTDOWN_GRACE_S``, a second signal) cannot tell whether it was stored, and a finish
that also claimed the worker's next missions (``worker.run.claim_ahead``) would leave them
leased and unseen. So the run's terminal statements (its finish, a run skipped or a mission
completed without a run, its park for an approval) are not cut off: ``await_answer`` gives
the statement a few more seconds to answer, and the cancellation goes on after that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["ANSWER_WAIT_S", "await_answer"]

T = TypeVar("T")

ANSWER_WAIT_S = 5.0
"""Seconds a cancelled run waits for the answer of the statement it sent (as long as the
runner gives a shutdown's interruption to be stored: ``SHUTDOWN_STORE_S``)."""


async def await_answer(statement: Awaitable[T], *, within_s: float = ANSWER_WAIT_S) -> T:
    """``await statement``, shielded from a cancellation of the caller.

    Returns what the statement returns, and raises what it raises, when it ends before the
    caller is cancelled. When the caller is cancelled first, the statement is given up to
    ``within_s`` seconds more to end (then it is cancelled; more cancellations meanwhile do
    not shorten the wait), and ``asyncio.CancelledError`` is raised; a caller that passed a
    task reads from it how the statement ended.
    """
    task = asyncio.ensure_future(statement)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not task.done() and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait({task}, timeout=left)
            except asyncio.CancelledError:
                continue  # asked again to stop: the answer is still worth its few seconds
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: what the caller sees is its cancellation
        raise
