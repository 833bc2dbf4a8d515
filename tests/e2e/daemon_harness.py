"""Driving ``mana-ai`` as real processes, as an operator would: the CLI, worker daemons, and
waiting on what they store. Shared by the e2e tests."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from unittest import mock

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes import chat_completion_body
from worker.cli import main
from worker.db.tables import mission_iterations

__all__ = [
    "TIMEOUT_S",
    "McpServeProcess",
    "cli",
    "clock_then_answer",
    "env_for",
    "finished_iterations",
    "free_port",
    "run_cli",
    "start_cli",
    "start_mcp_serve",
    "start_serve",
    "start_worker",
    "stop",
    "wait_until",
]

TIMEOUT_S = 60.0


def clock_then_answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Call clock_now first; answer once a tool result is in the conversation."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return 200, chat_completion_body(content="Noted the time.")
    return 200, chat_completion_body(tool_calls=[("clock_now", {})])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def env_for(database_url: str, llm_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MANA_AI_")}
    env |= {
        "MANA_AI_DATABASE_URL": database_url,
        "MANA_AI_LLM_BASE_URL": llm_url,
        "MANA_AI_TICK_INTERVAL_S": "0.2",
        "MANA_AI_LLM_MAX_RETRIES": "0",
        "MANA_AI_METRICS_HOST": "127.0.0.1",
        "MANA_AI_METRICS_PORT": "0",
        "MANA_AI_LOG_FORMAT": "json",
    }
    return env | extra


async def run_cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``mana-ai ARGS`` as a process: (exit status, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def cli(env: dict[str, str], *args: str) -> Any:
    """``mana-ai ARGS --json``, which must succeed; its parsed output. For what a test sets up
    or looks at around the processes it tests, so it runs in this process (in a thread, with
    ``env`` as the environment): the same code as the command, without a start of Python and
    its imports each time (``run_cli`` is the command as a process)."""
    code, out, err = await asyncio.wait_for(
        asyncio.to_thread(_in_process, env, [*args, "--json"]), TIMEOUT_S
    )
    assert code == 0, f"mana-ai {' '.join(args)} failed: {err}"
    return json.loads(out)


_environment = threading.Lock()


def _in_process(env: dict[str, str], argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment,
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def start_cli(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    """``mana-ai ARGS`` started as a process (stdout discarded, stderr piped); end it with
    ``stop``."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def start_worker(env: dict[str, str]) -> asyncio.subprocess.Process:
    return await start_cli(env, "worker")


class McpServeProcess:
    """A ``mana-ai mcp serve`` (or ``serve``) process: its URL (from the line it prints once it
    listens) and everything it writes to stderr (read all along, so the pipe never fills)."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, first: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.lines = first
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            self.lines.append(line.decode())

    async def stop(self) -> tuple[int, str]:
        """SIGTERM, then (exit status, stderr)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)
        await asyncio.wait_for(self._drain, TIMEOUT_S)
        return code, "".join(self.lines)


async def start_mcp_serve(env: dict[str, str]) -> McpServeProcess:
    """Start ``mana-ai mcp serve`` and wait for the line saying where it listens."""
    return await _start_server(env, ["mcp", "serve"], "mana-ai: serving MCP at ")


async def start_serve(env: dict[str, str]) -> McpServeProcess:
    """Start ``mana-ai serve`` (the API and console) and wait for the line saying where it
    listens; its ``url`` is the API's base (``http://host:port/api/v1``)."""
    return await _start_server(env, ["serve"], "mana-ai: serving the API at ")


async def _start_server(env: dict[str, str], argv: list[str], ready: str) -> McpServeProcess:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            raw = await proc.stderr.readline()
            if not raw:
                raise AssertionError(
                    f"{' '.join(argv)} exited ({await proc.wait()}): {''.join(lines)}"
                )
            line = raw.decode()
            lines.append(line)
            if line.startswith(ready):
                url = line.removeprefix(ready).split(" ", 1)[0]
                return McpServeProcess(proc, url, lines)


async def wait_until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if value := await check():
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def stop(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def finished_iterations(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(mission_iterations).where(mission_iterations.c.status != "running")
        )
        return [dict(r) for r in rows.mappings()]
