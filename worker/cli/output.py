"""How the ``mana-ai`` commands print: one line for people, ``--json`` for scripts, tables.

Nothing a command prints shows a hidden character raw (``worker.terminal_text``: terminal
escapes, bidi controls, other controls and invisible characters): ``main`` runs every command
inside ``visible_streams``, which writes stdout and stderr through ``visible``; tables and
fields escape before they measure, ``print_json`` escapes inside JSON strings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TextIO

from worker import redaction
from worker.queries.stored import jsonable
from worker.terminal_text import visible, visible_json, visible_line

__all__ = [
    "CELL_CHARS",
    "cell",
    "emit",
    "fields",
    "fmt",
    "jsonable",
    "print_json",
    "table",
    "visible_streams",
]


def fmt(value: Any) -> str:
    """A cell: ISO times to the second, ``-`` for nothing, lists joined by commas."""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON (``visible_json``: hidden characters as ``\\u``
    escapes, so the output parses back to ``value`` and shows nothing hidden)."""
    print(visible_json(jsonable(value), indent=2))


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
    """``value`` as a table cell: ``fmt`` on one line (``visible_line``: a newline shows as
    ``\\n``, a tab as ``\\t``, an escape or bidi control as ``\\u001b``, ``\\u202e``), at
    most ``CELL_CHARS`` characters with ``…`` where cut."""
    text = visible_line(fmt(value))
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def fields(row: dict[str, Any], key_width: int = 18) -> None:
    """Print ``row`` one field a line, ``key: value`` with the keys right-aligned in
    ``key_width``; a value of several lines (an objective) goes on under its first line,
    indented to it, so that no line of it can pass for another field."""
    indent = " " * (key_width + 2)
    for key, value in row.items():
        first, *rest = visible(fmt(value)).split("\n")
        print(f"{key:>{key_width}}: {first}")
        for line in rest:
            print(f"{indent}{line}")


class _VisibleStream:
    """A text stream that writes what it is given through ``visible`` (newlines and tabs kept), with
    the process's secrets masked (``worker.redaction``); everything else (``flush``, ``fileno``,
    ``buffer``, ``isatty``) is the wrapped stream's, so binary writers (``mcp serve --stdio``) are
    untouched."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(redaction.redact(visible(text)))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


@contextmanager
def visible_streams() -> Iterator[None]:
    """While it lasts, ``sys.stdout`` and ``sys.stderr`` (and log handlers made meanwhile)
    write every hidden character as an escape: what a command prints, its error messages and
    its log lines cannot move the cursor, set the title or reorder text, whatever the database
    or a peer put in them, and never show a secret of the process (``worker.redaction``). The
    streams are restored on exit."""
    saved = sys.stdout, sys.stderr
    sys.stdout = _VisibleStream(saved[0])
    sys.stderr = _VisibleStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
