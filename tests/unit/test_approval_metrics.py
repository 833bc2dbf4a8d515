"""The approval figures a worker exports: read from the store (the scheduler's job every
interval), exported as they stand, and not exported (rather than stale) while the store does
not answer."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from worker import metrics
from worker.daemon.serve import _ApprovalFigures


class Figures:
    def __init__(self) -> None:
        self.answers: list[Any] = [({"approved": 3, "denied": 1}, 2, 42.5), OSError("down")]
        self.read = asyncio.Event()

    async def stats(self) -> tuple[dict[str, int], int, float]:
        answer = self.answers.pop(0) if self.answers else ({}, 0, 0.0)
        self.read.set()
        if isinstance(answer, BaseException):
            raise answer
        return answer


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_the_figures_are_exported_as_read_and_dropped_while_unreadable() -> None:
    figures = Figures()
    job = _ApprovalFigures(figures)  # type: ignore[arg-type]
    try:
        await job.read()
        assert sample("mana_ai_approvals_total", decision="approved") == 3
        assert sample("mana_ai_approvals_total", decision="expired") == 0
        assert sample("mana_ai_approvals_pending") == 2
        assert sample("mana_ai_approval_oldest_pending_seconds") == 42.5
        await job.read()  # the store does not answer: nothing exported, rather than stale
        assert sample("mana_ai_approvals_pending") is None and job.failing
        await job.read()  # back
        assert sample("mana_ai_approvals_pending") == 0 and not job.failing
    finally:
        metrics.APPROVALS.clear()
