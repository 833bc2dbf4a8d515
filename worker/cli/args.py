"""Argument types and usage errors shared by the ``mana-ai`` command groups.

A value that does not parse is an ``argparse.ArgumentTypeError`` (argparse prints it and exits
2); a combination of flags that makes no sense is a ``UsageError`` raised by the command (the
entry point prints it and exits 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from worker.admin.values import (
    INT32_MAX,
    MAX_ID,
    MAX_LIMIT,
    MAX_ROUNDS,
    aware_datetime,
    catch_up_window,
    int_range,
    iteration_ref,
    limit,
    positive_int,
    row_id,
)
from worker.errors import UsageError
from worker.names import MAX_NAME_CHARS, MAX_TEXT_CHARS, checked_name, checked_text

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = [
    "INT32_MAX",
    "MAX_ID",
    "MAX_LIMIT",
    "MAX_NAME_CHARS",
    "MAX_ROUNDS",
    "MAX_TEXT_CHARS",
    "Command",
    "UsageError",
    "aware_datetime",
    "catch_up_window",
    "checked_name",
    "checked_text",
    "group",
    "int_range",
    "iteration_ref",
    "json_flag",
    "limit",
    "positive_int",
    "row_id",
]

Command = Callable[[argparse.Namespace, "Settings"], Awaitable[int]]
"""``async (args, settings) -> exit status``: what a subcommand's ``command_fn`` is."""


def group(commands: Any, name: str, helptext: str) -> Any:
    """A command group (``mana-ai NAME COMMAND``); returns its subparsers."""
    parser = commands.add_parser(name, help=helptext, description=helptext)
    return parser.add_subparsers(title="commands", metavar="COMMAND", required=True)


def json_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` (print JSON for scripts)."""
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
