"""What README.md and the documentation pages under ``docs/`` say, for the tests that hold the
code to them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["DOCS", "README", "documented_responses", "page", "section"]

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"

_RESPONSE = re.compile(r"\b([1-5]\d\d) `(\{[^`]*\})`")


def page(path: str) -> str:
    """The text of the documentation page ``path`` (under ``docs/``, e.g.
    ``reference/health.md``)."""
    return (DOCS / path).read_text(encoding="utf-8")


def section(path: str, heading: str) -> str:
    """The text of the section ``heading`` (e.g. ``## /healthz``) of the documentation page
    ``path``, up to the next heading of any level."""
    text = "\n" + page(path)
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(r"^#{1,6} ", text[start:], flags=re.MULTILINE)
    return text[start : start + following.start()] if following else text[start:]


def documented_responses(text: str) -> list[tuple[int, dict[str, Any]]]:
    """Each HTTP response ``text`` documents as ``STATUS `{JSON body}```, in order."""
    return [(int(code), json.loads(body)) for code, body in _RESPONSE.findall(text)]
