"""How the ``mana-ai`` commands print: one line for people, ``--json`` for scripts, tables."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

__all__ = ["CELL_CHARS", "cell", "emit", "fmt", "jsonable", "print_json", "table"]


def fmt(value: Any) -> str:
    """A cell: ISO times to the second, ``-`` for nothing, lists joined by commas."""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO strings and tuples as lists."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    print(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


def emit(args: argparse.Namespace, row: dict[str, Any], text: str) -> None:
    """Print ``row`` as JSON with ``--json``, else ``text``."""
    if args.json:
        print_json(row)
    else:
        print(text)


CELL_CHARS = 60
"""Longest table cell; longer values (an objective, an error) end in ``…`` (``show`` and
``--json`` give them in full)."""


def table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Print ``rows`` as an aligned table of ``columns`` (each cell on one line, cut at
    ``CELL_CHARS`` characters), or ``(none)``."""
    if not rows:
        print("(none)")
        return
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def cell(value: Any) -> str:
    """``value`` as a table cell: ``fmt``, whitespace runs (newlines too) as one space, at most
    ``CELL_CHARS`` characters with ``…`` where cut."""
    text = " ".join(fmt(value).split())
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"
