"""The hot statements (the claim, a round's write, the finish) compiled once and run on the
pooled asyncpg connection itself: per run, no statement compiled or looked up, no parameter
processed by SQLAlchemy's execution layer, no result row wrapped.

SQLAlchemy builds a statement (``worker.store.claim``, ``worker.store.round_writes``, each
cached per shape) and compiles it once per dialect here (``PreparedStatement``): its text for
asyncpg (``$1`` … placeholders), the order its parameters go in, each one's bind processor
(JSONB: encoded to text, once; an ``EncodedJSON`` brings its text and is sent as it is), and
its constant parameters written into the text as literals (``status = 'active'``:
PostgreSQL's generic plan for the statement can then use the partial indexes whose
predicates name them). ``run_prepared`` runs it: a connection from the engine's
pool (its checkout and ping rules unchanged), ``fetch`` on the asyncpg connection under it, in
autocommit (one round trip), the connection back to the pool.

Errors are SQLAlchemy's, as ``worker.store.engine.run_statement`` raises them: asyncpg's
errors are translated by SQLAlchemy's asyncpg adapter and wrapped in ``DBAPIError`` (with
``connection_invalidated`` when SQLAlchemy's dialect calls it a disconnect; the connection is
then invalidated, never back into the pool, and the statement runs once more on another).
Behind PgBouncer in transaction mode (``behind_pgbouncer``), statements run through
``run_statement`` instead (its unique prepared-statement names and BEGIN/COMMIT).

Rows are asyncpg ``Record``s: read by column name (``row["owned"]``, ``row.get("calls")``),
JSONB decoded (SQLAlchemy's codec on the connection), as ``RowMapping``s are read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import JSON
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from worker.store.dbapi_errors import as_dbapi_error
from worker.store.engine import behind_pgbouncer, connection_broken, run_statement
from worker.store.transient import describe_error

__all__ = ["EncodedJSON", "PreparedStatement", "prepared", "run_prepared"]

logger = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"\$(\d+)")


class EncodedJSON(list[Any]):
    """A JSON array (the list itself, as ``json.loads`` gives it) with its JSON ``text``, made
    once: bound to a JSONB parameter of a ``PreparedStatement``, the text is sent as it is
    instead of being encoded again. Anywhere else it is the plain list it is. Build it from
    text that encodes exactly this list (``worker.store.rows.messages_json`` does) and do not
    change the list afterwards: the text would no longer say what it holds."""

    __slots__ = ("text",)

    def __init__(self, items: list[Any], text: str) -> None:
        super().__init__(items)
        self.text = text


class PreparedStatement:
    """``stmt`` compiled once for ``dialect`` (asyncpg's): ``text`` with ``$n`` placeholders,
    ``names`` (the parameter each ``$n`` takes, in order) and their bind processors.

    Constant parameters (the values SQLAlchemy binds for literals in the statement: strings,
    integers, booleans) are written into ``text`` as SQL literals; the parameters a caller
    binds (``bindparam("p_…")`` without a value) stay placeholders, renumbered.

    Raises:
        ValueError: at construction, for a statement whose parameters are not positional or
            that has a parameter to expand at run time (``IN`` of a list a caller binds).
    """

    def __init__(self, stmt: Any, dialect: Dialect) -> None:
        compiled = stmt.compile(dialect=dialect)
        positions = compiled.positiontup
        if positions is None:
            raise ValueError(f"{dialect.name}: only positional parameters are supported")
        self.statement = stmt
        names: list[str] = []
        numbers: dict[str, int] = {}
        replacement: dict[int, str] = {}
        expanded: dict[str, str] = {}
        placeholder = 0
        for name in positions:
            bind = compiled.binds[name]
            if bind.expanding:  # IN of a constant list: its values as literals, no number
                values = [_literal(v) for v in bind.value or ()]
                if bind.required or not values or None in values:
                    raise ValueError(f"parameter {name} expands at run time (IN of a list)")
                expanded[name] = ", ".join(v for v in values if v is not None)
                continue
            placeholder += 1
            literal = None if bind.required else _literal(bind.value)
            if literal is not None:
                replacement[placeholder] = literal
                continue
            if name not in numbers:
                names.append(name)
                numbers[name] = len(names)
            replacement[placeholder] = f"${numbers[name]}"
        text = _PLACEHOLDER.sub(lambda m: replacement[int(m.group(1))], str(compiled))
        for name, listed in expanded.items():
            text = text.replace(f"__[POSTCOMPILE_{name}]", listed)
        self.text: str = text
        self.names: tuple[str, ...] = tuple(names)
        self._processors = tuple(
            compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in names
        )
        # the JSON parameters, whose bind processor encodes a value to its JSON text: an
        # ``EncodedJSON`` brings that text already
        self._json = tuple(isinstance(compiled.binds[name].type, JSON) for name in names)
        self._defaults = {
            name: compiled.binds[name].value for name in names if not compiled.binds[name].required
        }

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The driver's arguments for ``params`` (by name), processed as SQLAlchemy would
        (JSON encoded, …).

        Raises:
            KeyError: a parameter the statement needs is not in ``params``.
        """
        arguments = []
        for name, process, is_json in zip(self.names, self._processors, self._json, strict=True):
            value = params[name] if name in params else self._defaults[name]
            if is_json and type(value) is EncodedJSON:
                arguments.append(value.text)
            else:
                arguments.append(process(value) if process is not None else value)
        return arguments


def _literal(value: Any) -> str | None:
    """``value`` as a SQL literal (a string, an integer, a boolean), else ``None``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None


_compiled: dict[tuple[int, str], PreparedStatement] = {}


def prepared(stmt: Any, dialect: Dialect) -> PreparedStatement:
    """``stmt`` compiled for ``dialect``, once per statement object: for statements built
    once and kept (``functools.cache``), never for one built per call (it would be kept for
    ever)."""
    key = (id(stmt), dialect.name + "+" + str(dialect.driver))
    found = _compiled.get(key)
    if found is None or found.statement is not stmt:
        found = _compiled[key] = PreparedStatement(stmt, dialect)
    return found


async def run_prepared(
    engine: AsyncEngine, stmt: Any, params: Mapping[str, Any], *, idempotent: bool = True
) -> Sequence[Mapping[str, Any]]:
    """Run ``stmt`` (built once and kept: see ``prepared``) with ``params`` on its own and
    return its rows; what ``run_statement`` does, without SQLAlchemy's execution layer.

    Args:
        idempotent: a second run after a first that committed is harmless, so a statement
            whose connection broke under it runs once more on another (the default); with
            ``False`` (a claim) the break is raised: the first run may have committed.

    Raises:
        sqlalchemy.exc.DBAPIError: the database failed or refused it (a broken connection:
            after the second try, on another connection; at once unless ``idempotent``).
        TimeoutError, OSError: as ``run_statement`` raises them.
    """
    if behind_pgbouncer(engine):
        rows = await run_statement(engine, stmt, dict(params), idempotent=idempotent)
        return cast(Sequence[Mapping[str, Any]], rows)
    statement = prepared(stmt, engine.dialect)
    arguments = statement.arguments(params)
    try:
        return await _fetch(engine, statement, arguments)
    except DBAPIError as exc:
        if not connection_broken(exc) or not idempotent:
            raise
        logger.warning(
            "database connection lost (%s); running the statement again on another",
            describe_error(exc),
        )
        return await _fetch(engine, statement, arguments)


async def _fetch(
    engine: AsyncEngine, statement: PreparedStatement, arguments: list[Any]
) -> Sequence[Mapping[str, Any]]:
    # The pool's connection itself (``raw_connection``: a quarter of ``connect()``'s CPU, which
    # builds a Connection and switches greenlets twice), back to the pool at the end, as
    # ``connect()`` would: its checkout and check-in events, its reset (a rollback, nothing to
    # do: asyncpg runs the statement in autocommit, no transaction is ever begun on it).
    try:
        fairy = await engine.raw_connection()
    except Exception as error:  # wrapped as ``engine.connect()`` wraps a failed connect
        Connection._handle_dbapi_exception_noconnection(error, engine.dialect, engine.sync_engine)
    try:
        driver: Any = fairy.driver_connection
        try:
            rows: Sequence[Mapping[str, Any]] = await driver.fetch(statement.text, *arguments)
            return rows
        except Exception as error:
            wrapped = as_dbapi_error(
                engine.dialect,
                error,
                adapter=fairy.dbapi_connection,
                statement=statement.text,
                arguments=arguments,
            )
            if wrapped is None:
                raise
            if connection_broken(wrapped) and fairy.is_valid:
                await greenlet_spawn(fairy.invalidate)  # never back into the pool
            raise wrapped from wrapped.orig
    finally:
        fairy.close()
