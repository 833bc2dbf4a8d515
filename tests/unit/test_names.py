"""The one rule for names and free text (``worker.names``), and the command line's use of it."""

from __future__ import annotations

import pytest

from worker.cli.args import UsageError, checked_name, checked_text
from worker.names import MAX_NAME_CHARS, MAX_TEXT_CHARS, normalised_name, normalised_text


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("  padded  ", "padded"),
        ("\tsome agent\n", "some agent"),
        ("Zoë-ü/Europe", "Zoë-ü/Europe"),
        ("x" * MAX_NAME_CHARS, "x" * MAX_NAME_CHARS),
    ],
)
def test_names_are_trimmed(given: str, expected: str) -> None:
    assert normalised_name(given) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("   ", "must not be empty"),
        ("a\nb", "must not contain control or invisible characters ('\\n')"),
        ("x" * 10_000, "is 10000 characters long; at most 200"),
        ("a\u200bb", "invisible"),  # zero-width space
        ("a\u202eb", "invisible"),  # right-to-left override
        ("a\x00b", "control"),
        ("a\udcffb", "control"),  # an undecodable byte on the command line
    ],
)
def test_names_that_are_refused(given: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        normalised_name(given)
    assert message in str(caught.value)


def test_text_keeps_lines_and_tabs_but_not_other_controls() -> None:
    assert normalised_text("  line one\r\n\tline two \n") == "line one\n\tline two"
    assert normalised_text("x" * MAX_TEXT_CHARS) == "x" * MAX_TEXT_CHARS
    with pytest.raises(ValueError, match="at most 20,000"):
        normalised_text("x" * (MAX_TEXT_CHARS + 1))
    with pytest.raises(ValueError, match=r"\(U\+0000 NUL at line 1, column 3\)"):
        normalised_text("ab\x00c")
    with pytest.raises(ValueError, match="undecodable"):
        normalised_text("bad \udcff byte")
    with pytest.raises(ValueError, match="must not be empty"):
        normalised_text(" \n\t ")
    assert normalised_text("emoji \U0001f469\u200d\U0001f4bb ok") == "emoji 👩‍💻 ok"  # ZWJ


def test_the_command_line_names_the_flag() -> None:
    assert checked_name(" a ", "--agent") == "a"
    with pytest.raises(UsageError, match=r"^--model must not contain control"):
        checked_name("gpt\n4", "--model")
    with pytest.raises(UsageError, match=r"^--objective is 20,001 characters long"):
        checked_text("x" * 20_001, "--objective")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("Summarise \u202egnp.exe", "bidi embeddings, overrides or isolates (U+202E RIGHT-TO-LEFT"),
        ("one\ntwo \u2066x\u2069", "(U+2066 LEFT-TO-RIGHT ISOLATE at line 2, column 5)"),
        ("a\u202ab", "U+202A LEFT-TO-RIGHT EMBEDDING at line 1, column 2"),
        ("\x1b]0;title\x07 ok", "control characters other than newline and tab (U+001B ESC"),
        ("ding\x07", "(U+0007 BEL at line 1, column 5)"),
        ("csi \x9b31m", "(U+009B at line 1, column 5)"),  # C1: ESC [ on some terminals
        ("lone\rreturn", "U+000D CR"),
    ],
)
def test_text_refuses_bidi_controls_and_terminal_escapes_saying_which_and_where(
    given: str, message: str
) -> None:
    # the names rule refuses every format character; long text refuses the ones that reorder
    # what is displayed (the Trojan Source set), and every control but newline and tab
    with pytest.raises(ValueError) as caught:
        normalised_text(given)
    assert message in str(caught.value)
    with pytest.raises(ValueError):
        normalised_name(given)


def test_text_keeps_the_format_characters_languages_need() -> None:
    # Persian needs the zero-width non-joiner, right-to-left prose the bidi marks
    for text in (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "\u05e9\u05dc\u05d5\u05dd \u200f(1)",
    ):
        assert normalised_text(text) == text


def test_the_command_line_names_the_flag_of_refused_text() -> None:
    with pytest.raises(UsageError, match=r"^--system-prompt must not contain bidi"):
        checked_text("be nice\u202e", "--system-prompt")
