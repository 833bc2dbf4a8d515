"""Fixtures shared by the integration tests that drive the ``mana-ai`` commands in-process."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.cli import main


@pytest.fixture
def run(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Any:
    """``run(*argv) -> (exit status, stdout, stderr)``: ``mana-ai`` in-process against the
    test database (emptied by ``db``), with an LLM endpoint nobody listens on."""
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://127.0.0.1:9/v1")

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke
