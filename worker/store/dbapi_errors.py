"""asyncpg's errors as SQLAlchemy raises them (``as_dbapi_error``): for the statements run on
the pooled asyncpg connection itself (``worker.store.prepared``) and for the reads a command
makes on a connection of its own (``worker.store.direct``), so that both fail in the engine's
words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

__all__ = ["as_dbapi_error"]


def as_dbapi_error(
    dialect: Dialect,
    error: Exception,
    *,
    adapter: Any = None,
    statement: str | None = None,
    arguments: Sequence[Any] = (),
) -> DBAPIError | None:
    """``error`` (asyncpg's) as SQLAlchemy raises it for a statement: translated by its asyncpg
    adapter into the driver's DB-API error and wrapped in ``DBAPIError``
    (``connection_invalidated`` when the dialect calls it a disconnect); ``None`` for an error
    SQLAlchemy passes through as it is (a timeout, a cancellation). ``statement``: its text,
    shown in the error with ``arguments``; ``adapter``: the connection's adapter, when there
    is one (it also forgets a transaction the error ended); ``dialect`` must have its DB-API
    loaded (``dialect.loaded_dbapi``)."""
    try:
        if adapter is not None:
            adapter._handle_exception(error)
        else:
            AsyncAdapt_asyncpg_connection._handle_exception_no_connection(
                dialect.loaded_dbapi, error
            )
    except Exception as translated:
        dbapi_error = dialect.loaded_dbapi.Error
        if not isinstance(translated, dbapi_error):
            return None
        invalidated = dialect.is_disconnect(translated, adapter, None)
        wrapped = DBAPIError.instance(
            statement,
            tuple(arguments) if statement is not None else None,
            translated,
            dbapi_error,
            connection_invalidated=invalidated,
            dialect=dialect,
        )
        return wrapped if isinstance(wrapped, DBAPIError) else None
    return None
