"""The tutorial's commands, as its pages write them (``docs/tutorial/``), run against a fake
OpenAI-compatible endpoint and the test database: a reader who copies them gets what the pages
say. Lines that start a process that runs until it is stopped (``mana-ai worker``,
``mana-ai serve``) are left out; the first page's command is README's run command, which
``bench/first_run.py`` and the quick-start tests run."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes.llm_server import FakeLLMServer, chat_completion_body
from tests.readme import page
from worker.cli import main

RUNS_UNTIL_STOPPED = (["worker"], ["serve"])


def shell_lines(path: str) -> list[str]:
    """The lines of every ``sh`` block of page ``path``, continuations joined."""
    blocks = re.findall(r"```sh\n(.*?)```", page(path), flags=re.DOTALL)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def commands(path: str) -> tuple[dict[str, str], list[list[str]]]:
    """``(variables the page exports, each mana-ai command's arguments)`` of page ``path``."""
    env, argvs = {}, []
    for line in shell_lines(path):
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            env[name] = value
        elif words[:1] == ["mana-ai"] and words[1:] not in RUNS_UNTIL_STOPPED:
            argvs.append(words[1:])
    return env, argvs


@pytest.fixture
def llm() -> Any:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def invoke(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    llm: FakeLLMServer,
) -> Any:
    """``invoke(env, argv) -> (status, stdout)``: ``mana-ai`` in-process on the test database
    with ``env`` set, the endpoint the page names replaced by the fake one."""

    def run(env: dict[str, str], argv: list[str]) -> tuple[int, str]:
        with monkeypatch.context() as scoped:
            for name, value in env.items():
                scoped.setenv(name, value)
            scoped.setenv("MANA_AI_DATABASE_URL", database_url)
            scoped.setenv("MANA_AI_LLM_BASE_URL", llm.base_url)
            status = main(argv)
        out, err = capsys.readouterr()
        assert status == 0, f"mana-ai {shlex.join(argv)}: exit {status}; {err}"
        return status, out

    return run


def test_a_real_endpoint(invoke: Any, llm: FakeLLMServer) -> None:
    env, argvs = commands("tutorial/real-endpoint.md")
    assert set(env) == {"MANA_AI_LLM_BASE_URL", "MANA_AI_LLM_API_KEY", "MANA_AI_LLM_MODEL"}
    assert [argv[:2] for argv in argvs] == [
        ["agents", "add"], ["missions", "add"], ["tick", "--once"], ["iterations", "show"],
    ]  # fmt: skip
    llm.enqueue(
        json=chat_completion_body(tool_calls=[("clock_now", {"timezone": "Europe/Berlin"})])
    )
    llm.enqueue(json=chat_completion_body(tool_calls=[("notes_create", {"title": "time"})]))
    llm.enqueue(json=chat_completion_body(content="Saved the time in a note titled time."))
    outputs = [invoke(env, argv)[1] for argv in argvs]
    shown = outputs[-1]
    # what the page says the iteration shows: two calls, a read and a write, and the verdict
    assert "clock_now" in shown and "notes_create" in shown
    assert "verdict: succeeded" in shown
    # the page's key and model reached the endpoint
    assert llm.requests[0]["model"] == env["MANA_AI_LLM_MODEL"]
    assert llm.headers[0]["authorization"] == f"Bearer {env['MANA_AI_LLM_API_KEY']}"


def test_a_cron_mission(invoke: Any) -> None:
    _, setup = commands("tutorial/real-endpoint.md")
    env, argvs = commands("tutorial/cron-mission.md")
    invoke(env, setup[0])  # the agent the page goes on with
    outputs = [invoke(env, argv)[1] for argv in argvs]
    assert [argv[:2] for argv in argvs] == [["missions", "add"], ["missions", "list"]]
    assert "30 7 * * 1-5" in outputs[-1] and "Europe/Berlin" in outputs[-1]


def test_the_console_needs_a_token(invoke: Any) -> None:
    env, argvs = commands("tutorial/console.md")
    assert argvs == [["admin", "token", "create", "alice"]]  # and `mana-ai serve`
    assert "alice" in invoke(env, argvs[0])[1]


def test_the_worker_page_starts_the_worker() -> None:
    assert commands("tutorial/worker-daemon.md") == ({}, [])
    assert "mana-ai worker" in shell_lines("tutorial/worker-daemon.md")
