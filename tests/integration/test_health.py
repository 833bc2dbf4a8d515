"""``/healthz`` answers what the health reference (``docs/reference/health.md``) documents:
the worker's metrics endpoint and ``mcp serve``
(``tests/integration/test_mcp_serve.py`` checks the latter against the same text)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.readme import documented_responses, section
from worker.metrics import HealthState, MetricsServer


def shape(body: dict[str, Any]) -> dict[str, Any]:
    """What a body promises: its keys, the type of each value, and its status word."""
    return {"status": body.get("status"), **{k: type(v).__name__ for k, v in body.items()}}


def worker_documented() -> list[tuple[int, dict[str, Any]]]:
    text = section("reference/health.md", "## /healthz")
    return documented_responses(text.split("`mana-ai mcp serve` has no tick", 1)[0])


@pytest.fixture
def health() -> Iterator[tuple[HealthState, str]]:
    state = HealthState(stale_after_s=3600)
    server = MetricsServer("127.0.0.1", 0, state)
    server.start()
    try:
        yield state, f"http://127.0.0.1:{server.port}/healthz"
    finally:
        server.stop()


def test_the_workers_healthz_answers_as_documented(
    health: tuple[HealthState, str],
) -> None:
    # the docs said 200 {"status": "ok"}; the worker answered with two more fields
    [(ok_code, ok_body), (stale_code, stale_body)] = worker_documented()
    state, url = health
    state.tick_ok()
    answer = httpx.get(url)
    assert (answer.status_code, shape(answer.json())) == (ok_code, shape(ok_body))
    state.tick_failed("DatabaseError: could not connect")
    state.stale_after_s = -1.0  # no tick succeeded within it
    answer = httpx.get(url)
    assert (answer.status_code, shape(answer.json())) == (stale_code, shape(stale_body))
    assert answer.json()["last_error"] == "DatabaseError: could not connect"


def test_before_the_first_tick_the_worker_says_so_as_documented(
    health: tuple[HealthState, str],
) -> None:
    _, url = health
    body = httpx.get(url).json()
    assert body["status"] == "ok" and body["seconds_since_last_ok_tick"] is None
    assert "`seconds_since_last_ok_tick` is `null` until the first tick succeeds" in section(
        "reference/health.md", "## /healthz"
    )
