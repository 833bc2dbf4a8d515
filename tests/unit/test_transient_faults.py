"""Which database failures are transient (``is_transient``: retried while the lease holds) and
which say the connection's server will not take writes any more (``server_gone``: the engine
discards the connection and the pool). A failover is both (issue 36)."""

from __future__ import annotations

import asyncpg.exceptions as pg
import pytest
from sqlalchemy.exc import DBAPIError

from worker.db.transient import is_transient, server_gone


def wrapped(orig: Exception) -> DBAPIError:
    """``orig`` as SQLAlchemy raises it from a statement."""
    return DBAPIError("INSERT INTO notes …", {}, orig)


CASES = [
    # (failure, transient, server gone)
    (
        pg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        True,
        True,
    ),
    (pg.CannotConnectNowError("the database system is in recovery mode"), True, True),
    (pg.CannotConnectNowError("the database system is starting up"), True, True),
    (pg.AdminShutdownError("terminating connection due to administrator command"), True, True),
    (pg.CrashShutdownError("terminating connection because of crash of another"), True, True),
    (pg.ConnectionFailureError("connection failure"), True, True),
    (
        pg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        True,
        True,
    ),
    (pg.TargetServerAttributeNotMatched("None of the hosts match … read-write"), True, False),
    (ConnectionRefusedError(111, "Connect call failed"), True, False),
    (pg.SerializationError("could not serialize access"), True, False),
    (pg.UniqueViolationError("duplicate key value"), False, False),
    (ValueError("not a database failure"), False, False),
]


@pytest.mark.parametrize(("failure", "transient", "gone"), CASES, ids=lambda c: type(c).__name__)
def test_a_failover_is_transient_and_ends_the_connection(
    failure: Exception, transient: bool, gone: bool
) -> None:
    for raised in (failure, wrapped(failure)):
        assert (is_transient(raised), server_gone(raised)) == (transient, gone)
