"""What README.md documents, for the tests that hold the code to it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["README", "documented_responses", "section"]

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")

_RESPONSE = re.compile(r"\b([1-5]\d\d) `(\{[^`]*\})`")


def section(heading: str) -> str:
    """The text of README's section ``heading`` (e.g. ``### Metrics and health``), up to the
    next heading of any level."""
    start = README.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(r"^#{1,6} ", README[start:], flags=re.MULTILINE)
    return README[start : start + following.start()] if following else README[start:]


def documented_responses(text: str) -> list[tuple[int, dict[str, Any]]]:
    """Each HTTP response ``text`` documents as ``STATUS `{JSON body}```, in order."""
    return [(int(code), json.loads(body)) for code, body in _RESPONSE.findall(text)]
