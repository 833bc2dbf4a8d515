"""Secrets kept out of every text mana-ai stores, logs, exports or prints.

A peer may echo a credential it was given: an OpenAI-compatible proxy answers 401 with
"Incorrect API key provided: sk-…" (LiteLLM's CVE-2025-0330 is the same kind), an MCP server
quotes the header it refused, a webhook receiver its URL. mana-ai cannot know which peer does,
so it redacts every secret the operator configured wherever it writes text: the stored rows
(``worker.store.rows.json_safe``, which every stored text goes through), the log lines
(``worker.logs``), the trace spans (``worker.tracing``), the command line's output
(``worker.cli.output.visible_streams``) and, through the rows, the API and the console.

The secrets are the process's: the entry point installs those of the settings
(``worker.settings.configured_secrets``: the three LLM endpoints' keys and URL credentials,
the database password, the approval webhook's URL, the OTLP exporter's headers) and a run adds
its agent's MCP servers' header and environment values before it opens them. Like the logging
configuration, this is state of the process, set at its entry and read below; it only grows.

Each secret is matched as written and in the forms a peer's text may carry it: JSON-escaped
(as in a JSON body), with ``\\uXXXX`` escapes, percent-encoded (as in a URL) and
HTML-escaped (as in a console page). A match is
replaced by ``***``. Secrets shorter than ``MIN_SECRET_CHARS`` are not matched (they would
blank ordinary words); the entry point warns about them.
"""

from __future__ import annotations

import html
import json
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = [
    "MASK",
    "MIN_SECRET_CHARS",
    "Redactor",
    "add_secrets",
    "install",
    "redact",
    "redact_json",
    "redactor",
]

MASK = "***"
"""What a secret is replaced by (the same mask URLs get in messages)."""

MIN_SECRET_CHARS = 4
"""Shorter secrets are not redacted: they would blank ordinary words in every text."""


class Redactor:
    """Replaces a set of secrets by ``MASK`` in text.

    Args:
        secrets: the secret values; empty, whitespace-only and shorter ones
            (``MIN_SECRET_CHARS``) are ignored.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        kept = {s for s in secrets if isinstance(s, str) and len(s.strip()) >= MIN_SECRET_CHARS}
        self.secrets: frozenset[str] = frozenset(kept)
        forms = {form for secret in kept for form in _forms(secret)}
        # longest first: a secret that contains another is masked whole
        ordered = sorted(forms, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def with_secrets(self, secrets: Iterable[str]) -> Redactor:
        """A redactor of these secrets and ``secrets`` (this one, when nothing is new)."""
        more = {s for s in secrets if isinstance(s, str)} - self.secrets
        return Redactor(self.secrets | more) if more else self

    def found(self, text: str) -> bool:
        """True when ``text`` holds a secret in any of its forms."""
        return self._pattern is not None and self._pattern.search(text) is not None

    def text(self, text: str) -> str:
        """``text`` with every secret (in every form) replaced by ``MASK``."""
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)

    def json(self, value: Any) -> Any:
        """``value`` (JSON data: dicts, lists, strings, numbers) with every string, keys
        included, redacted; a new value, ``value`` itself when it holds no secret."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.json(item) for item in value]
        if isinstance(value, dict):
            return {self.json(key): self.json(item) for key, item in value.items()}
        return value


def _forms(secret: str) -> set[str]:
    """``secret`` as text may carry it: as is, JSON-escaped (with and without ``\\u``
    escapes for non-ASCII), percent-encoded (path and form style), HTML-escaped."""
    forms = {
        secret,
        json.dumps(secret, ensure_ascii=False)[1:-1],
        json.dumps(secret)[1:-1],
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        html.escape(secret),
    }
    return {form for form in forms if len(form) >= MIN_SECRET_CHARS}


_lock = threading.Lock()
_active = Redactor()


def redactor() -> Redactor:
    """The process's redactor (immutable: a change installs a new one)."""
    return _active


def install(secrets: Iterable[str]) -> Redactor:
    """Make ``secrets`` the process's secrets (the entry point, from the settings); returns the
    redactor installed."""
    global _active
    with _lock:
        _active = Redactor(secrets)
        return _active


def add_secrets(secrets: Iterable[str]) -> None:
    """Add ``secrets`` to the process's (an agent's MCP server headers, before a run opens
    it). Secrets are never removed: text logged later may still quote them."""
    global _active
    with _lock:
        _active = _active.with_secrets(secrets)


def redact(text: str) -> str:
    """``text`` with the process's secrets replaced by ``MASK``."""
    return _active.text(text)


def redact_json(value: Any) -> Any:
    """``value`` (JSON data) with the process's secrets replaced by ``MASK`` in every string."""
    return _active.json(value)
