"""A trace collector that is down never holds ``mana-ai tick --once`` or a worker's stop past
``worker.tracing.setup.SHUTDOWN_S``: real processes, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` at
a ``DeadCollector`` (one that accepts connections and never answers, one that drops every
SYN, a port that refuses), each measured against the same command without tracing in the
same test (the machine is shared and noisy: the bounds are generous, but an export that holds
the exit for the exporter's 10 s timeout, or the old 5 s wait, fails them)."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import (
    TIMEOUT_S,
    cli,
    clock_then_answer,
    env_for,
    run_cli,
    start_worker,
    stop,
)
from tests.fakes import FakeLLMServer

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the [otel] extra")

from tests.fakes.otlp_receiver import DEAD_MODES, DeadCollector
from worker.tracing.setup import SHUTDOWN_S

SLACK_S = 3.0
"""What a traced command may take beyond the same command untraced and ``SHUTDOWN_S``:
loading the SDK (about 0.3 s here) and a shared machine's noise (untraced ticks of one test
ranged 4.3-6.6 s on a loaded 2-core CI machine). The fault these tests hold added 12-15 s;
on a quiet machine a traced tick takes 0.39-0.48 s more than an untraced one."""


def untraced(database_url: str, llm_url: str, **extra: str) -> dict[str, str]:
    """``env_for`` without any ``OTEL_*`` variable of the test's own environment."""
    env = env_for(database_url, llm_url, **extra)
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")}


def traced_to(env: dict[str, str], endpoint: str) -> dict[str, str]:
    return env | {"MANA_AI_OTEL": "on", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}


async def timed_tick(env: dict[str, str], agent: str) -> tuple[float, str]:
    """A mission of ``agent`` due now, then ``mana-ai tick --once``: (seconds, stderr)."""
    await cli(env, "missions", "add", "--agent", agent, "--objective", "Time?", "--due-now")
    started = time.monotonic()
    code, out, err = await run_cli(env, "tick", "--once")
    elapsed = time.monotonic() - started
    assert code == 0, err
    assert out.strip() == "tick ran 1 mission(s): succeeded", out
    return elapsed, err


async def test_tick_once_with_the_collector_down_ends_within_the_bound_of_its_time_untraced(
    db: AsyncEngine, database_url: str
) -> None:
    # before: 17.9 s against 2.3 s untraced (a black hole), 14.7 s (a refused port): the
    # stop's wait (5 s), then the meter provider's atexit hook exporting once more with the
    # exporter's whole timeout and backoff
    with FakeLLMServer(clock_then_answer) as llm:
        env = untraced(database_url, llm.base_url)
        await cli(env, "agents", "add", "--name", "ticker", "--owner", "dana")
        baseline = [(await timed_tick(env, "ticker"))[0]]
        for mode in DEAD_MODES:
            with DeadCollector(mode) as dead:
                elapsed, err = await timed_tick(traced_to(env, dead.endpoint), "ticker")
            baseline.append((await timed_tick(env, "ticker"))[0])
            bound = max(baseline) + SHUTDOWN_S + SLACK_S
            assert elapsed < bound, (mode, elapsed, baseline)
            assert f"metrics within {SHUTDOWN_S:g} s: they are dropped" in err, (mode, err)
            if mode == "black_hole":
                assert dead.accepted > 0  # the exporter did reach it


async def stopped_mid_run(env: dict[str, str], llm: FakeLLMServer, agent: str) -> float:
    """A worker started with a mission of ``agent`` whose request the LLM holds, stopped
    (SIGTERM) mid-run: seconds from the signal to its exit (0)."""
    await cli(env, "missions", "add", "--agent", agent, "--objective", "Time?", "--due-now")
    llm.hang()
    proc = await start_worker(env)
    seen = len(llm.requests)
    await asyncio.to_thread(llm.wait_for_requests, seen + 1, TIMEOUT_S)  # mid-run now
    started = time.monotonic()
    code, err = await stop(proc)
    elapsed = time.monotonic() - started
    llm.release()
    assert code == 0, err
    return elapsed


async def test_a_worker_stops_within_its_grace_and_the_bound_with_the_collector_down(
    db: AsyncEngine, database_url: str
) -> None:
    # before: 15.3 s with a 2 s grace (a black hole); the run interrupted by the stop ends its
    # spans then, so the last export has something to send
    grace_s = 2.0
    with FakeLLMServer(clock_then_answer) as llm:
        llm.unused_ok = True
        env = untraced(database_url, llm.base_url, MANA_AI_SHUTDOWN_GRACE_S=str(grace_s))
        await cli(env, "agents", "add", "--name", "stopper", "--owner", "erin")
        baseline = await stopped_mid_run(env, llm, "stopper")
        assert baseline >= grace_s  # the run was in flight: the stop waited the grace
        for mode in DEAD_MODES:
            with DeadCollector(mode) as dead:
                elapsed = await stopped_mid_run(traced_to(env, dead.endpoint), llm, "stopper")
                assert mode != "black_hole" or dead.accepted > 0  # the exporter reached it
            assert elapsed < max(baseline, grace_s) + SHUTDOWN_S + SLACK_S, (
                mode,
                elapsed,
                baseline,
            )
