"""An MCP stdio server's stderr as log records (``worker.mcp.stdio.StderrLines``): one a line,
escaped, naming the server, bounded in line length and rate, whatever the server writes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from worker.mcp.stdio import STDERR_BURST, STDERR_LINE_BYTES, StderrLines


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Logged(logging.Handler):
    """The messages logged to ``worker.mcp.stdio`` from now on, as a list."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def logged() -> Iterator[list[str]]:
    handler = Logged()
    log = logging.getLogger("worker.mcp.stdio")
    level = log.level
    log.setLevel(logging.INFO)  # setLevel, not .level =: it clears the cached isEnabledFor
    log.addHandler(handler)
    yield handler.messages
    log.removeHandler(handler)
    log.setLevel(level)


def test_each_line_is_a_record_naming_the_server_with_its_text_escaped(
    logged: list[str],
) -> None:
    lines = StderrLines("hs (stdio: srv)")
    lines.feed(b"boom \x1b[31m\nsecond ")
    lines.feed(b"half\r\n\n not utf-8 \xff \xe2\x80\xae")
    lines.finish()
    assert logged == [
        "MCP server hs (stdio: srv) (stderr): boom \\u001b[31m",
        "MCP server hs (stdio: srv) (stderr): second half",
        "MCP server hs (stdio: srv) (stderr):  not utf-8 \\xff \\u202e",
    ]
    assert all(m.isprintable() for m in logged)


def test_a_line_past_the_limit_is_cut_and_its_rest_only_counted(logged: list[str]) -> None:
    lines = StderrLines("hs")
    chunk = b"y" * 65536
    for _ in range(160):  # 10 MiB without an end of line
        lines.feed(chunk)
    lines.feed(b"\nnext\n")
    cut, after = logged
    assert cut == (
        f"MCP server hs (stderr): {'y' * STDERR_LINE_BYTES} … "
        f"({160 * 65536 - STDERR_LINE_BYTES} more bytes not logged)"
    )
    assert after == "MCP server hs (stderr): next"


def test_a_flood_is_logged_at_the_rate_and_what_was_left_out_is_counted(
    logged: list[str],
) -> None:
    clock = Clock()
    lines = StderrLines("hs", per_s=10, clock=clock)
    lines.feed(b"line\n" * 100_000)
    assert len(logged) == STDERR_BURST  # the first ones, at once
    clock.now += 1.0  # room for 10 more
    lines.feed(b"later\n")
    assert logged[-1] == (
        "MCP server hs (stderr): later "
        f"({100_000 - STDERR_BURST} line(s) before it not logged: more than 10 a second)"
    )
    lines.feed(b"dropped\n" * 50)
    lines.finish()
    assert logged[-1] == (
        "MCP server hs: 41 more stderr line(s) not logged (more than 10 a second)"
    )
    assert len(logged) == STDERR_BURST + 1 + 9 + 1
