"""The exit-status table of the troubleshooting page (``docs/how-to/troubleshooting.md``),
walked: every example in it is run against a known state and must end with its row's status,
and every command has at least one example."""

from __future__ import annotations

import re
import shlex
import socket
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.readme import section
from worker.cli import build_parser, main

TABLE = section("how-to/troubleshooting.md", "## Exit status")


def _table() -> list[tuple[int, str]]:
    """(status, example) for every example in the exit-status table."""
    rows = []
    for line in TABLE.splitlines():
        match = re.match(r"^\| (\d) \| [^|]+ \| (.+) \|$", line)
        if match:
            rows += [(int(match.group(1)), ex) for ex in re.findall(r"`([^`]+)`", match.group(2))]
        elif rows and not line.startswith("|"):
            break
    return rows


def _commands(example: str) -> list[tuple[dict[str, str], list[str]]]:
    """``A=1 mana-ai x y && mana-ai z`` → ``[({"A": "1"}, ["x", "y"]), ({}, ["z"])]``."""
    commands = []
    for part in example.split("&&"):
        words = shlex.split(part)
        env = {}
        while words and "=" in words[0] and words[0].startswith("MANA_AI_"):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        assert words[:1] == ["mana-ai"], f"an example runs mana-ai: {example!r}"
        commands.append((env, words[1:]))
    return commands


def _command_name(argv: list[str]) -> str:
    nested = {"db", "agents", "missions", "iterations", "policy", "mcp", "approvals", "admin"}
    return " ".join(argv[:2]) if argv[0] in nested else argv[0]


EXAMPLES = _table()


def test_the_table_has_an_example_for_every_command_and_status() -> None:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    commands = set()
    for name, group in sub.choices.items():  # type: ignore[attr-defined]
        nested = [a for a in group._actions if a.__class__.__name__ == "_SubParsersAction"]
        commands |= {f"{name} {c}" for c in nested[0].choices} if nested else {name}
    covered = {_command_name(argv) for _, ex in EXAMPLES for _, argv in _commands(ex)}
    assert commands - covered == set(), "commands without an example in the exit-status table"
    assert {status for status, _ in EXAMPLES} == {0, 1, 2}


@pytest.fixture
def invoke(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Any:
    """Runs ``mana-ai`` in-process with extra variables; returns (status, stderr). The state
    is the table's: agent ``a`` of user ``u``, mission 1 recurring and not due, mission 2
    one-shot, due and paused, the LLM endpoint unreachable."""
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MANA_AI_LLM_MAX_RETRIES", "0")

    def run(env: dict[str, str], argv: list[str]) -> tuple[int, str]:
        with monkeypatch.context() as scoped:
            for name, value in env.items():
                scoped.setenv(name, value)
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse: --help (0) and malformed values (2)
                status = int(exc.code or 0)
        return status, capsys.readouterr().err

    for argv in (
        ["agents", "add", "--name", "a", "--owner", "u"],
        ["missions", "add", "--agent", "a", "--objective", "x", "--cron", "0 9 * * *"],
        ["missions", "add", "--agent", "a", "--objective", "x", "--due-now"],
        ["missions", "pause", "2"],
    ):
        assert run({}, argv)[0] == 0, argv
    return run


@pytest.mark.parametrize(("status", "example"), EXAMPLES, ids=[ex for _, ex in EXAMPLES])
def test_each_example_exits_with_its_rows_status(invoke: Any, status: int, example: str) -> None:
    *before, last = _commands(example)
    if last[1][0] == "worker" and "--help" not in last[1]:
        # a worker that starts would run until a signal: an example must make it stop at once
        assert last[0], f"{example!r} would start a daemon"
    for env, argv in before:
        assert invoke(env, argv)[0] == 0, argv
    got, err = invoke(*last)
    assert got == status, f"{example}: exit {got}, the docs say {status}; stderr: {err}"


def test_a_metrics_port_in_use_is_an_invalid_setting(invoke: Any) -> None:
    # the table's row for invalid settings says so; the trial saw another status
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {"MANA_AI_METRICS_HOST": "127.0.0.1", "MANA_AI_METRICS_PORT": str(port)}
        status, err = invoke(env, ["worker"])
    assert status == 2 and "MANA_AI_METRICS_HOST / MANA_AI_METRICS_PORT" in err, err
    assert "invalid settings" in err
