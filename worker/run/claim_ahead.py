"""Claiming ahead: a run's finish that also claims the worker's next missions.

A worker whose last claim filled every free slot (more missions may be due) does not wait
for a tick to fill the slot a run frees: the run's finish claims for it, in the same step
(``MissionStore.finish_iteration`` with a ``ClaimOrder``; for PostgreSQL, one statement, so
a mission costs one round trip where a finish and a claim cost two). The worker
(``worker.daemon.tick.Worker``) is the ``ClaimAhead``: it says how many to claim, and starts
what was claimed.

Only the first statement of a finish claims. A repeat after a failure (a retry, a degraded
finish) does not, nor does the store repeat it (``MissionStore.finish_iteration``): a claim
whose answer was lost leaves its missions leased to this worker and not run, until their
lease expires and a claim takes them over (as after a crash), and a repeat would only add
more of them.

A stop does not cancel a run while its finish is under way (``MissionRunner.storing_end``):
what the finish claimed is started, and interrupted by the stop like every other run, not
left leased and unseen.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from worker.store.base import ClaimOrder

__all__ = ["ClaimAhead", "FinishClaim"]

T = TypeVar("T")


class ClaimAhead(Protocol):
    """Who a run's finish claims for (the worker)."""

    def order(self) -> ClaimOrder | None:
        """The claim to make with this finish, its slots held until ``settle``; ``None``:
        none (no backlog, or the worker is stopping)."""
        ...

    def settle(self, order: ClaimOrder, *, made: bool) -> None:
        """The finish that carried ``order`` ran (``made``: its missions are in
        ``order.claimed``, to be started) or did not (raised, was cancelled, or never ran:
        nothing to start)."""
        ...


class FinishClaim:
    """The claim of one run's finish: ``ahead``'s order, given to the finish's first
    statement only (``send``) and settled exactly once (``send``, else ``close``)."""

    def __init__(self, ahead: ClaimAhead | None) -> None:
        self._ahead = ahead
        self._order = ahead.order() if ahead is not None else None

    async def send(self, finish: Callable[[ClaimOrder | None], Awaitable[T]]) -> T:
        """``finish(order)`` for the first statement, ``finish(None)`` for any repeat."""
        order, self._order = self._order, None
        if order is None or self._ahead is None:
            return await finish(None)
        made = False
        try:
            result = await finish(order)
            made = True
            return result
        finally:
            self._ahead.settle(order, made=made)

    def close(self) -> None:
        """Settle an order no statement carried (the finish never ran)."""
        order, self._order = self._order, None
        if order is not None and self._ahead is not None:
            self._ahead.settle(order, made=False)
