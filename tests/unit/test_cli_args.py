"""Every command-line value is checked where it is parsed: numbers against what they feed."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from worker.cli import build_parser
from worker.cli.args import INT32_MAX, int_range


def _actions() -> Iterator[tuple[str, argparse.Action]]:
    """(command, action) for every option and positional of every command."""
    parser = build_parser()
    [top] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in top.choices.items():
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        commands = nested[0].choices.items() if nested else [("", sub)]
        for cmd, cmd_parser in commands:
            for action in cmd_parser._actions:
                yield f"{name} {cmd}".strip(), action


TYPED = [
    pytest.param(action, id=f"{command} {'/'.join(action.option_strings) or action.dest}")
    for command, action in _actions()
    if callable(action.type) and action.type not in (str, str.lower)
]


@pytest.mark.parametrize("action", TYPED)
def test_no_typed_value_takes_a_number_beyond_what_the_database_holds(
    action: argparse.Action,
) -> None:
    # "agents add --max-rounds 100000000000" reached PostgreSQL ("value out of int32 range")
    assert callable(action.type)
    for huge in ("100000000000000000000", "-100000000000000000000"):
        with pytest.raises(argparse.ArgumentTypeError):
            action.type(huge)


def test_max_rounds_and_budgets_are_bounded_by_their_columns() -> None:
    parser = build_parser()
    for argv, flag in (
        (
            ["agents", "add", "--name", "a", "--owner", "u", "--max-rounds", "100000000000"],
            "rounds",
        ),
        (["agents", "set", "a", "--max-tokens-per-day", str(INT32_MAX + 1)], "tokens"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2, flag
    parsed = parser.parse_args(["agents", "set", "a", "--max-tokens-per-day", str(INT32_MAX)])
    assert parsed.max_tokens_per_day == INT32_MAX


def test_int_range_says_where_its_bound_comes_from() -> None:
    parse = int_range(1, 10, "a reason")
    assert parse(" 7 ") == 7
    with pytest.raises(argparse.ArgumentTypeError, match=r"at most 10 \(a reason\), got 11"):
        parse("11")
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        parse("0")
    with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
        parse("1e3")
