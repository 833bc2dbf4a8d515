"""What may reach a terminal (``worker.terminal_text``), the command line's streams and the
log lines that use it."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from worker.cli.output import cell, visible_streams
from worker.logs import configure_logging
from worker.terminal_text import describe_char, visible, visible_json, visible_line

RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u200f", "\x7f", "\r", "\u2028")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b]0;title\x07", "\\u001b]0;title\\u0007"),  # OSC: set the window title
        ("\x1b[2J\x1b[31mred", "\\u001b[2J\\u001b[31mred"),  # clear the screen, colour
        ("\x9b31m", "\\u009b31m"),  # C1 CSI, ESC [ on terminals that read 8-bit controls
        ("abc\u202egnp.exe", "abc\\u202egnp.exe"),  # RIGHT-TO-LEFT OVERRIDE
        ("\u2066\u2069\u200e\u200f\u061c", "\\u2066\\u2069\\u200e\\u200f\\u061c"),
        ("zero\u200bwidth\u00adsoft", "zero\\u200bwidth\\u00adsoft"),
        ("del\x7f bs\x08 cr\r", "del\\u007f bs\\u0008 cr\\r"),
        ("tag \U000e0041", "tag \\U000e0041"),  # above U+FFFF: eight digits, unambiguous
        ("bad \udcff byte", "bad \\udcff byte"),  # a surrogate: an undecodable byte
        ("lines\nand\ttabs stay", "lines\nand\ttabs stay"),
        ("Zoë, 東京, 👩\u200d💻", "Zoë, 東京, 👩\\u200d💻"),
        ("", ""),
    ],
)
def test_visible_writes_every_hidden_character_as_an_escape(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_a_one_line_value_cannot_break_its_line() -> None:
    assert visible_line("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert cell("objective\nline two\x1b[2J") == "objective\\nline two\\u001b[2J"


@pytest.mark.parametrize(
    "value",
    [
        {"objective": "x\x1b]0;t\x07\u202e\x9b\U000e0041\n\t", "n": 1},
        ["\udcff", "é 東京 👩\u200d💻", None, 2.5],
        "plain",
    ],
)
def test_json_shows_nothing_hidden_and_parses_back_to_the_same_value(value: object) -> None:
    for indent in (None, 2):
        text = visible_json(value, indent=indent)
        assert not any(c in text for c in RAW)
        assert json.loads(text) == value
    assert "é 東京 👩" in visible_json(["é 東京 👩"])  # readable, not \u-escaped


@pytest.mark.parametrize(
    ("char", "named"),
    [
        ("\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("\x1b", "U+001B ESC"),
        ("\x00", "U+0000 NUL"),
        ("\x7f", "U+007F DEL"),
        ("\x9b", "U+009B"),
        ("\udcff", "U+DCFF"),
        ("\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A"),
    ],
)
def test_describe_char_names_a_character_for_a_message(char: str, named: str) -> None:
    assert describe_char(char) == named


def test_the_command_line_streams_escape_whatever_is_printed() -> None:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        with visible_streams():
            print("title \x1b]0;x\x07 and \u202eevil")
            print("error \x9b2J", file=sys.stderr)
            assert sys.stdout.isatty() is False  # the rest is the wrapped stream's
    finally:
        sys.stdout, sys.stderr = saved
    assert out.getvalue() == "title \\u001b]0;x\\u0007 and \\u202eevil\n"
    assert err.getvalue() == "error \\u009b2J\n"


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logger")
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_quote_what_models_and_peers_wrote_without_raw_escapes(
    fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", fmt)
    said = "no_spaces\x1b]0;pwned\x07\u202e\x9b"
    logging.getLogger("worker.mcp").warning("MCP server answered %s", said)
    logging.getLogger("worker.mcp").warning("%s", said)  # a message without a space either
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and not any(c in line for line in lines for c in RAW)
    if fmt == "json":
        assert json.loads(lines[1])["msg"] == said
    else:
        value = lines[1].split(" msg=", 1)[1]
        assert json.loads(value) == said  # quoted: read back, it is what was said
