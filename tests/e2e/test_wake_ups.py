"""``mana-ai worker`` as a real process with the default-like 30 s tick: ``missions add
--due-now`` and ``missions resume`` start an iteration within a second (LISTEN/NOTIFY), and
under PgBouncer (or MANA_AI_WAKE_UP=false) the daemon says at start that it waits for the tick.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import TIMEOUT_S, cli, clock_then_answer, env_for, free_port
from tests.fakes import FakeLLMServer
from worker.db.tables import mission_iterations


class Daemon:
    """A ``mana-ai worker`` process whose stderr is read all along (the pipe never fills)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._new_line = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, env: dict[str, str]) -> Daemon:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker.cli",
            "worker",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            async with self._new_line:
                self.lines.append(raw.decode())
                self._new_line.notify_all()
        async with self._new_line:
            self._new_line.notify_all()

    async def wait_for_line(self, text: str) -> str:
        """The first line of stderr containing ``text`` (waits for it)."""
        async with asyncio.timeout(TIMEOUT_S), self._new_line:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                if self._reader.done():
                    raise AssertionError(f"the worker exited without logging {text!r}")
                await self._new_line.wait()

    async def stop(self) -> tuple[int, str]:
        """SIGTERM; (exit status, stderr)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)
        await asyncio.wait_for(self._reader, TIMEOUT_S)
        return code, "".join(self.lines)


async def started_iterations(engine: AsyncEngine, mission_id: int) -> int:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(mission_iterations.c.id).where(mission_iterations.c.mission_id == mission_id)
        )
        return len(rows.all())


async def seconds_until_started(engine: AsyncEngine, mission_id: int) -> float:
    """Seconds until ``mission_id`` has an iteration (polled: a database state)."""
    begun = time.monotonic()
    async with asyncio.timeout(TIMEOUT_S):
        while not await started_iterations(engine, mission_id):  # noqa: ASYNC110 - polls the db
            await asyncio.sleep(0.01)
    return time.monotonic() - begun


async def ticks_done(port: int) -> float:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        text = (await http.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mana_ai_ticks_total{")
    )


async def test_due_now_and_resume_start_within_1_s_with_a_30_s_tick(
    db: AsyncEngine, database_url: str
) -> None:
    port = free_port()
    with FakeLLMServer(clock_then_answer) as llm:
        env = env_for(
            database_url,
            llm.base_url,
            MANA_AI_TICK_INTERVAL_S="30",
            MANA_AI_METRICS_PORT=str(port),
        )
        await cli(env, "agents", "add", "--name", "eager", "--owner", "alice")
        add = ("missions", "add", "--agent", "eager", "--objective", "Note the time.")
        paused: dict[str, Any] = await cli(env, *add, "--due-now")
        await cli(env, "missions", "pause", str(paused["id"]))
        daemon = await Daemon.start(env)
        try:
            await daemon.wait_for_line("wake-ups: listening on channel mana_ai_due")
            async with asyncio.timeout(TIMEOUT_S):  # the first tick is done: the next is 30 s away
                while await ticks_done(port) < 1:  # noqa: ASYNC110 - polls the endpoint
                    await asyncio.sleep(0.05)

            added = await cli(env, *add, "--due-now")
            assert await seconds_until_started(db, added["id"]) < 1.0

            await cli(env, "missions", "resume", str(paused["id"]))
            assert await seconds_until_started(db, paused["id"]) < 1.0
            assert await ticks_done(port) >= 2  # woken ticks, not the scheduled one
        finally:
            code, stderr = await daemon.stop()
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"MANA_AI_DB_PGBOUNCER": "true"}, "wake-ups off (PgBouncer transaction mode"),
        ({"MANA_AI_WAKE_UP": "false"}, "wake-ups off (MANA_AI_WAKE_UP=false)"),
    ],
)
async def test_without_wake_ups_the_daemon_says_it_waits_for_the_tick(
    db: AsyncEngine, database_url: str, extra: dict[str, str], reason: str
) -> None:
    env = env_for(database_url, "http://127.0.0.1:9/v1", MANA_AI_TICK_INTERVAL_S="30") | extra
    daemon = await Daemon.start(env)
    try:
        line = await daemon.wait_for_line("wake-ups off")
    finally:
        code, stderr = await daemon.stop()
    assert code == 0, stderr
    assert reason in line
    assert "due missions wait for the next tick (every 30 s)" in line
    assert "wake-ups: listening" not in stderr
