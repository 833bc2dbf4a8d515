"""Helpers for the integration tests that drive the ``mana-ai`` commands (see the ``run``
fixture in ``tests/integration/conftest.py``)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["as_json"]


def as_json(run: Any, *argv: str) -> Any:
    """The parsed ``--json`` output of a command that must succeed."""
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    return json.loads(out)
