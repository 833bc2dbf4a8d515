"""Helpers for the integration tests that drive the ``mana-ai`` commands (see the ``run``
fixture in ``tests/integration/conftest.py``)."""

from __future__ import annotations

import json
from typing import Any

from worker.cli import build_parser

__all__ = ["as_json", "command_names"]


def as_json(run: Any, *argv: str) -> Any:
    """The parsed ``--json`` output of a command that must succeed."""
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def command_names() -> list[str]:
    """Every command of the ``mana-ai`` parser: ``tick``, ``agents list``, ``mcp token list``…"""

    def walk(parser: Any, prefix: list[str]) -> list[str]:
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            return [" ".join(prefix)]
        return [n for name, sub in subs[0].choices.items() for n in walk(sub, [*prefix, name])]

    return walk(build_parser(), [])
