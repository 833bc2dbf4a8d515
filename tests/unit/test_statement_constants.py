"""The statements a run uses over and over are built once (``worker.store.writes``,
``worker.store.claim``), so whatever they would bind apart from the run's values (``p_*``) is
the same on every execution: a constant, written into their SQL (``parts.constant``), where
PostgreSQL's generic plan of the prepared statement sees it. Bound, ``missions.status = $3``
kept PostgreSQL from ever using its generic plan for the claim (the partial index on active
missions is out of its reach), and every claim and finish was planned again:
``bench/db_floor.py`` measured the server's CPU per mission at 2.0-2.2 ms, against 0.9-1.2 ms
once written in."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.dialects.postgresql import asyncpg

from worker.store import claim
from worker.store.writes import ends, parts, progress

STATEMENTS: dict[str, Any] = {
    "finished": ends.finished(),
    "finished_and_claimed(1)": ends.finished_and_claimed(1),
    "finished_and_claimed(None)": ends.finished_and_claimed(None),
    "interrupted": ends.interrupted(),
    "parked": ends.parked(),
    "moved_on": ends.moved_on(),
    "checkpoint": progress.checkpoint(),
    "reserved_checkpoint": progress.reserved_checkpoint(),
    "claim_statement(1)": claim.claim_statement(1),
    "claim_statement(1000)": claim.claim_statement(1000),
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_a_statement_built_once_binds_only_the_runs_values(name: str) -> None:
    compiled = STATEMENTS[name].compile(dialect=asyncpg.dialect())
    constants = {
        key: bind.value for key, bind in compiled.binds.items() if not key.startswith("p_")
    }
    assert not constants, f"{name} binds constants: {constants}"
    assert "POSTCOMPILE" not in compiled.string, f"{name} renders a value per execution"


@pytest.mark.parametrize(
    ("value", "sql"),
    [
        ("active", "'active'"),
        ("it's", "'it''s'"),
        (1, "1"),
        (None, "NULL"),
    ],
)
def test_a_constant_is_written_as_sql(value: Any, sql: str) -> None:
    assert str(parts.constant(value).compile(dialect=asyncpg.dialect())) == sql


def test_a_constant_is_not_a_boolean_or_an_object() -> None:
    with pytest.raises(TypeError, match="not a SQL constant"):
        parts.constant(True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a SQL constant"):
        parts.constant([1])  # type: ignore[arg-type]
