"""A URL that lists several hosts (issue 36): the worker's engine skips a host that is down
and connects to the next, as libpq does; ``test_failover.py`` follows a real switchover."""

from __future__ import annotations

import socket

from sqlalchemy import text

from worker.database_url import parse_url
from worker.db.engine import check_connection, create_engine


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def multi_host_url(database_url: str, first_port: int) -> str:
    """``database_url``'s database behind two hosts: a dead one first, then the real one,
    in libpq's authority form."""
    real = parse_url(database_url)
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
