"""Lease renewal for every mission a worker runs: one statement per period, not one per mission.

A claim leases a mission for ``lease`` (``MANA_AI_LEASE_S``). While missions run, the
``LeaseKeeper`` renews all of this worker's leases every ``lease / 3`` in one ``UPDATE … WHERE
id = ANY(…) AND lease_owner = worker RETURNING id`` (``MissionStore.renew_leases``). A mission
missing from what comes back was taken over by another worker: its run is told (its event is
set) and cancelled, so it writes nothing more. A renewal that fails (a database blip) is
logged and tried again a period later; the leases still have two thirds of their time. A
transient failure (``worker.db.transient``) is one warning line with its cause; anything else
is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from worker.db.transient import describe_error, is_transient, retry_transient
from worker.store.base import MissionStore

__all__ = ["HeldLease", "LeaseKeeper"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class HeldLease:
    """One mission's lease while its run holds it (``LeaseKeeper.hold``).

    Attributes:
        mission_id: the mission.
        lease_s: the lease's length in seconds.
        renewed_at: ``time.monotonic()`` of the hold, or of the start of the last renewal
            that found the lease still ours.
        lost: set once a renewal found the lease taken over (the run was cancelled, unless
            ``detach``ed).
        run: the task cancelled when the lease is found lost (``None``: none).
    """

    mission_id: int
    lease_s: float
    renewed_at: float = field(default_factory=time.monotonic)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    run: asyncio.Task[Any] | None = None

    @property
    def expires_at(self) -> float:
        """``time.monotonic()`` until which no other worker can have claimed the mission."""
        return self.renewed_at + self.lease_s

    def detach(self) -> None:
        """Stop cancelling the run when the lease is found lost (it is storing its outcome,
        which then writes nothing); ``lost`` is still set."""
        self.run = None

    async def retry(self, operation: Callable[[], Awaitable[T]], *, what: str) -> T:
        """``operation()`` with its transient database failures retried until the lease
        expires as known now (``expires_at``) or is found lost (``retry_transient``).

        Raises:
            Whatever the last attempt raised (see ``retry_transient``).
        """
        return await retry_transient(
            operation, deadline=self.expires_at, what=what, stop=self.lost.is_set
        )


class LeaseKeeper:
    """Renews the leases of the missions ``hold`` registers until they are ``release``d.

    Args:
        store: where leases live.
        worker_id: the lease owner.
        lease: the lease length; renewed every ``lease / 3``.

    The renewal task runs only while something is held (started by the first ``hold``, ending
    when nothing is held at a renewal time).
    """

    def __init__(self, store: MissionStore, *, worker_id: str, lease: timedelta) -> None:
        self.store = store
        self.worker_id = worker_id
        self.lease = lease
        self._held: dict[int, HeldLease] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> frozenset[int]:
        """The ids of the missions whose leases are being renewed."""
        return frozenset(self._held)

    def hold(self, mission_id: int, run: asyncio.Task[Any] | None) -> HeldLease:
        """Renew ``mission_id``'s lease from now on (it was claimed just before); return the
        held lease, whose ``lost`` event is set (after ``run`` is cancelled) when the lease
        turns out to be lost."""
        held = HeldLease(mission_id, self.lease.total_seconds(), run=run)
        self._held[mission_id] = held
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renew(), name="lease-renewal")
        return held

    def release(self, mission_id: int) -> None:
        """Stop renewing ``mission_id``'s lease: its run stored its outcome (which released
        the lease in the database), or leaves the mission to whoever claims it after the lease
        expires."""
        self._held.pop(mission_id, None)

    async def renew_now(self) -> set[int]:
        """One renewal of every held lease; returns the ids found lost (already told)."""
        ids = list(self._held)
        if not ids:
            return set()
        started = time.monotonic()
        owned = await self.store.renew_leases(ids, worker_id=self.worker_id, lease=self.lease)
        lost = set()
        for mission_id in ids:
            if mission_id in owned:
                if (renewed := self._held.get(mission_id)) is not None:
                    renewed.renewed_at = started
                continue
            held = self._held.pop(mission_id, None)
            if held is None:  # released meanwhile: it finished, nothing was lost
                continue
            lost.add(mission_id)
            held.lost.set()
            if held.run is not None:
                held.run.cancel()
        return lost

    async def _renew(self) -> None:
        period = self.lease.total_seconds() / 3
        while self._held:
            await asyncio.sleep(period)
            try:
                await self.renew_now()
            except Exception as exc:  # the leases still have 2/3 of their time left
                if is_transient(exc):  # a blip: one line, its cause
                    logger.warning(
                        "lease renewal failed (%s); retrying in %.1f s", describe_error(exc), period
                    )
                else:
                    logger.exception("lease renewal failed; retrying in %.1f s", period)
