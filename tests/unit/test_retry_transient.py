"""``retry_transient``: the first attempt runs bare, and a transient failure of it is retried
by tenacity exactly as if tenacity had made it (its log line, its waits, its stops)."""

from __future__ import annotations

import logging
import time

import pytest

from worker.db import transient
from worker.db.transient import retry_transient


@pytest.fixture(autouse=True)
def quick_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transient, "RETRY_INITIAL_S", 0.001)
    monkeypatch.setattr(transient, "RETRY_MAX_WAIT_S", 0.002)


def failing(times: int, exc: Exception) -> tuple[list[int], object]:
    attempts: list[int] = []

    async def operation() -> str:
        attempts.append(len(attempts) + 1)
        if len(attempts) <= times:
            raise exc
        return "done"

    return attempts, operation


async def test_the_first_attempt_that_succeeds_is_the_answer() -> None:
    attempts, operation = failing(0, OSError("reset"))
    assert await retry_transient(operation, deadline=time.monotonic() + 5, what="x") == "done"
    assert attempts == [1]


async def test_transient_failures_are_retried_and_each_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts, operation = failing(2, ConnectionResetError("reset by peer"))
    with caplog.at_level(logging.WARNING):
        done = await retry_transient(operation, deadline=time.monotonic() + 5, what="storing")
    assert done == "done"
    assert attempts == [1, 2, 3]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("storing")]
    assert [line.split(":")[0] for line in lines] == [
        "storing failed (attempt 1",
        "storing failed (attempt 2",
    ]


async def test_a_failure_that_is_not_transient_is_raised_at_once() -> None:
    attempts, operation = failing(5, ValueError("bad data"))
    with pytest.raises(ValueError, match="bad data"):
        await retry_transient(operation, deadline=time.monotonic() + 5, what="x")
    assert attempts == [1]


async def test_stop_ends_the_retries_with_the_last_failure() -> None:
    attempts, operation = failing(5, OSError("refused"))
    with pytest.raises(OSError, match="refused"):
        await retry_transient(
            operation, deadline=time.monotonic() + 5, what="x", stop=lambda: len(attempts) >= 2
        )
    assert attempts == [1, 2]


async def test_a_deadline_passed_still_gets_one_attempt() -> None:
    attempts, operation = failing(5, OSError("refused"))
    with pytest.raises(OSError):
        await retry_transient(operation, deadline=time.monotonic() - 1, what="x")
    assert attempts == [1]
