"""A URL that lists several hosts (issue 36): the worker's engine skips a host that is down
and connects to the next, as libpq does, and leaves no connection to a server that answered
read-only in its pool; ``test_failover.py`` follows a real switchover."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import text

from worker.database_url import parse_url
from worker.db.engine import check_connection, create_engine, run_statement


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def multi_host_url(database_url: str, first_port: int) -> str:
    """``database_url``'s database behind two hosts: a dead one first, then the real one,
    in libpq's authority form."""
    real = parse_url(database_url)
    if not real.host:  # the embedded server listens on a Unix socket only
        pytest.skip("the database is reached by a Unix socket: a host list needs TCP hosts")
    user = f"{real.username}@" if real.username else ""
    return (
        f"postgresql://{user}127.0.0.1:{first_port},{real.host}:{real.port or 5432}/"
        f"{real.database}?target_session_attrs=read-write"
    )


async def test_a_dead_first_host_is_skipped(database_url: str) -> None:
    url = multi_host_url(database_url, closed_port())
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        await check_connection(engine)
        async with engine.connect() as conn:
            port = (await conn.execute(text("SELECT inet_server_port()"))).scalar_one()
            writable = (await conn.execute(text("SELECT NOT pg_is_in_recovery()"))).scalar_one()
        assert (port, writable) == (parse_url(database_url).port or 5432, True)
    finally:
        await engine.dispose()


async def test_a_read_only_answer_discards_the_connection_and_the_statement_runs_on_a_new_one(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pooled connection whose server turned read-only (what a demoted primary answers:
    25006) is thrown away with the pool, and the statement runs again on a fresh one."""
    engine = create_engine(database_url, pool_size=2, max_overflow=0)
    try:
        async with engine.connect() as conn:  # a connection left on a "demoted" server
            await conn.execute(text("SET SESSION default_transaction_read_only = on"))
            await conn.commit()
            demoted = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        with caplog.at_level("WARNING", logger="worker.db.engine"):
            # a write, refused on a read-only server
            await run_statement(
                engine, text("CREATE TABLE ha_probe AS SELECT pg_backend_pid() AS pid")
            )
        async with engine.connect() as conn:
            wrote = (await conn.execute(text("SELECT pid FROM ha_probe"))).scalar_one()
            await conn.execute(text("DROP TABLE ha_probe"))
            await conn.commit()
        assert wrote != demoted
        assert "read-only transaction" in caplog.text
        async with engine.connect() as conn:  # the pool kept no connection to it
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() != demoted
    finally:
        await engine.dispose()
