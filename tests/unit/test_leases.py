"""Lease renewal's log when a renewal fails: one warning line with the cause for a database
blip, a traceback only for what is not one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from datetime import timedelta
from typing import Any, cast

import pytest

from worker.run.leases import LeaseKeeper
from worker.store.base import MissionStore


class FailingRenewals:
    """A store whose renewals raise ``failure`` until ``failures`` ran out, then succeed."""

    def __init__(self, failure: Exception, failures: int = 2) -> None:
        self.failure = failure
        self.failures = failures
        self.renewed = asyncio.Event()

    async def renew_leases(
        self, mission_ids: Collection[int], *, worker_id: str, lease: timedelta
    ) -> set[int]:
        if self.failures:
            self.failures -= 1
            raise self.failure
        self.renewed.set()
        return set(mission_ids)


async def renew_through(store: FailingRenewals) -> None:
    keeper = LeaseKeeper(cast(MissionStore, store), worker_id="w", lease=timedelta(seconds=0.03))
    keeper.hold(1, None)
    await asyncio.wait_for(store.renewed.wait(), 10)
    keeper.release(1)


def renewal_records(caplog: pytest.LogCaptureFixture) -> list[Any]:
    return [r for r in caplog.records if r.getMessage().startswith("lease renewal failed")]


async def test_a_blip_is_one_warning_line_with_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="worker.run.leases")
    await renew_through(FailingRenewals(ConnectionRefusedError(111, "Connect call failed")))
    records = renewal_records(caplog)
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    assert all(r.exc_info is None for r in records)  # was a traceback at error, every time
    assert (
        records[0]
        .getMessage()
        .startswith(
            "lease renewal failed (ConnectionRefusedError: [Errno 111] Connect call failed); "
            "retrying in 0.0 s"
        )
    )


async def test_what_is_no_blip_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="worker.run.leases")
    await renew_through(FailingRenewals(KeyError("a bug"), failures=1))
    [record] = renewal_records(caplog)
    assert record.levelno == logging.ERROR and record.exc_info is not None
