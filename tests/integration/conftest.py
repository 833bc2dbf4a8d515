"""Fixtures shared by the integration tests: ``run`` drives the ``mana-ai`` commands
in-process; ``bounced`` is an engine through PgBouncer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes.db_proxy import FlakyProxy
from tests.pgbouncer import PgBouncer
from worker.cli import main
from worker.db.engine import create_engine


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


@pytest.fixture
async def bounced(
    pgbouncer: PgBouncer, db: AsyncEngine, database_url: str
) -> AsyncIterator[AsyncEngine]:
    """An engine on the test database through PgBouncer (``pgbouncer=True``), 10 connections."""
    engine = create_engine(
        pgbouncer.url_for(database_url), pool_size=10, max_overflow=0, pgbouncer=True
    )
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def proxy(database_url: str, db: AsyncEngine) -> AsyncIterator[FlakyProxy]:
    """A ``FlakyProxy`` in front of the test database (a worker connects through it, the test
    reads through ``db``, directly)."""
    async with FlakyProxy(database_url) as flaky:
        yield flaky
