"""The ``mana-ai`` command. Run ``mana-ai --help`` or ``mana-ai COMMAND --help``.

One module per command group (``db_cli``, ``agents_cli``, ``missions_cli``, ``daemon_cli`` for
``tick`` and ``worker``, ``iterations_cli``, ``replay_cli``, ``policy_cli``, ``approvals_cli``,
``mcp_cli``), each
with a ``register(commands)``
that adds its subcommands; ``args`` and ``output`` hold what they share.

Exit status: 0 success, 1 an operator error (the message says what and how to fix it),
2 bad usage or invalid settings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from worker.cli import (
    admin_cli,
    agents_cli,
    approvals_cli,
    daemon_cli,
    db_cli,
    iterations_cli,
    mcp_cli,
    missions_cli,
    policy_cli,
    replay_cli,
    serve_cli,
)
from worker.cli.args import UsageError
from worker.errors import ManaAIError, SettingsError

__all__ = ["main"]

GROUPS = (
    db_cli,
    agents_cli,
    missions_cli,
    daemon_cli,
    iterations_cli,
    replay_cli,
    policy_cli,
    approvals_cli,
    mcp_cli,
    serve_cli,
    admin_cli,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mana-ai`` console script; returns the exit status. Everything the
    command writes to stdout and stderr shows hidden characters as escapes
    (``worker.cli.output.visible_streams``). The logging it configures is undone on return,
    so that a caller in the same process (a test) keeps its own."""
    from worker.cli.output import visible_streams
    from worker.logs import logging_restored

    with visible_streams(), logging_restored():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "command_fn"):
        parser.print_help()
        return 2
    # imported once the command line parsed: `--version` and `--help` never load pydantic
    from worker.settings import load_settings, unknown_variables

    try:
        settings = load_settings()
    except SettingsError as exc:
        _print_settings_error(exc)
        return 2
    from worker.logs import configure_logging

    quiet = not getattr(args, "verbose_logs", False)
    level = "WARNING" if quiet and settings.logs.level.upper() == "INFO" else settings.logs.level
    configure_logging(level, settings.logs.format)
    for name in unknown_variables():
        print(f"mana-ai: warning: ignoring unknown setting {name}", file=sys.stderr)
    import asyncio

    try:
        status: int = asyncio.run(args.command_fn(args, settings))
        return status
    except UsageError as exc:
        print(f"mana-ai: usage error: {exc}", file=sys.stderr)
        return 2
    except SettingsError as exc:  # a setting found wrong only once its context is known
        _print_settings_error(exc)
        return 2
    except ManaAIError as exc:
        print(f"mana-ai: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `mana-ai … | head`: the reader left; that is not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not _is_database_error(exc):
            raise
        from worker.db.transient import describe_error

        print(f"mana-ai: database error: {describe_error(exc)}", file=sys.stderr)
        return 1


def _is_database_error(exc: Exception) -> bool:
    """The database went away mid-command: SQLAlchemy's or the socket's error (SQLAlchemy is
    imported here, where a command that used the database already loaded it)."""
    if isinstance(exc, OSError):
        return True
    from sqlalchemy.exc import SQLAlchemyError

    return isinstance(exc, SQLAlchemyError)


def _print_settings_error(exc: SettingsError) -> None:
    """``mana-ai: invalid settings: …`` once, then the offending variables, one per line."""
    lines = str(exc).splitlines()
    if len(lines) == 1:
        print(f"mana-ai: invalid settings: {lines[0]}", file=sys.stderr)
    else:
        print(
            "mana-ai: invalid settings:",
            *(f"  {line}" for line in lines),
            sep="\n",
            file=sys.stderr,
        )


class _VersionAction(argparse.Action):
    """``--version``: argparse's own action, except that the version is looked up (in the
    installed package's metadata, tens of milliseconds) only when the flag is given."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show the version and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from worker.version import package_version

        print(f"mana-ai {package_version()}")  # to stdout, as argparse's own action does
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every group's subcommands under ``mana-ai``."""
    parser = argparse.ArgumentParser(
        prog="mana-ai",
        description=(
            "Run scheduled missions for LLM agents. Settings come from MANA_AI_* environment "
            "variables (see docs/reference/settings.md). With no MANA_AI_DATABASE_URL an "
            "embedded PostgreSQL is started in MANA_AI_DATA_DIR; with no MANA_AI_LLM_BASE_URL "
            "the embedded SmolLM2 model answers."
        ),
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in GROUPS:
        module.register(commands)
    return parser
