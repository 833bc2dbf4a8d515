"""Which database failures are worth retrying, and retrying them until a deadline.

A *transient* failure says nothing about the data: the connection broke, the server is
restarting or shutting down, it has no connection slot free, the statement lost a
serialization or deadlock race, or nothing answered in time. The same statement may succeed a
moment later, so callers retry it (``retry_transient``). Anything else (a value out of range,
a constraint, a statement PostgreSQL cannot run) is the database *refusing* the data, and
running it again changes nothing.

The SQLSTATE classes and codes are PostgreSQL's (Appendix A, "PostgreSQL Error Codes"):

* class ``08`` connection exception (any code);
* ``40001`` serialization_failure, ``40P01`` deadlock_detected, ``40003``
  statement_completion_unknown;
* class ``53`` insufficient resources (``53300`` too_many_connections, ``53200`` out_of_memory,
  ``53100`` disk_full, ``53400`` configuration_limit_exceeded);
* ``55P03`` lock_not_available, ``57014`` query_canceled (a statement timeout or an
  administrator's cancel), ``57P01`` admin_shutdown, ``57P02`` crash_shutdown, ``57P03``
  cannot_connect_now, ``57P05`` idle_session_timeout;
* ``25006`` read_only_sql_transaction (a failover left the client on a standby);
* class ``58`` system error (I/O error on the server).

A *failover* is transient too: the server the connection reached answers ``25006`` (it was
demoted, or it is a standby), shuts down, or is starting up or in recovery (``57P0x``). Those
codes and class ``08`` also say the connection itself is of no more use
(``server_gone``): the engine discards it and every connection pooled before it
(``worker.db.engine``), so that the next attempt connects afresh and, with a multi-host URL and
``target_session_attrs=read-write``, finds the new primary.

Without a SQLSTATE: operating-system errors (refused, reset, unreachable, DNS; ``TimeoutError``
included), SQLAlchemy's pool timeout and disconnection errors, a connection SQLAlchemy marked
invalidated, asyncpg's interface errors (``connection is closed``, an operation cut off), and
its ``TargetServerAttributeNotMatched`` (no host of the URL is a primary yet: mid-failover).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InternalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_any,
    stop_before_delay,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)

__all__ = [
    "RETRY_INITIAL_S",
    "RETRY_MAX_WAIT_S",
    "SERVER_GONE_SQLSTATES",
    "TRANSIENT_SQLSTATES",
    "TRANSIENT_SQLSTATE_CLASSES",
    "describe_error",
    "is_transient",
    "retry_transient",
    "server_gone",
    "sqlstate_of",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_SQLSTATE_CLASSES = ("08", "53", "58")
"""SQLSTATE classes (first two characters) whose every code is transient."""

TRANSIENT_SQLSTATES = frozenset(
    {"25006", "40001", "40003", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "57P05"}
)
"""Single SQLSTATE codes that are transient (see the module docstring)."""

SERVER_GONE_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
"""Codes (beside class ``08``) after which the connection's server will not take this client's
writes: read-only (``read_only_sql_transaction``: demoted by a failover, or a standby),
``admin_shutdown``, ``crash_shutdown``, ``cannot_connect_now`` (starting up, in recovery)."""

RETRY_INITIAL_S = 0.05
"""The first wait before a retry, in seconds; it doubles (with jitter) after each failure."""

RETRY_MAX_WAIT_S = 2.0
"""The longest wait between two attempts, in seconds: a server back after an outage is used
within about this long."""


class _Stop:
    """A ``threading.Event``-like flag for tenacity's ``stop_when_event_set``."""

    def __init__(self, is_set: Callable[[], bool]) -> None:
        self.is_set = is_set


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE PostgreSQL sent with ``exc`` (or any exception in its cause chain), e.g.
    ``"57P01"``; ``None`` when none carries one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "sqlstate", None)
        if isinstance(code, str) and code:
            return code
        if isinstance(current, DBAPIError) and current.orig is not None:
            current = current.orig
            continue
        current = current.__cause__
    return None


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is a database failure that says nothing about the data, so the same
    statement may succeed when run again (see the module docstring for the list)."""
    code = sqlstate_of(exc)
    if code is not None:
        return code in TRANSIENT_SQLSTATES or code[:2] in TRANSIENT_SQLSTATE_CLASSES
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, InterfaceError | InternalError):
            return True
        orig = exc.orig
        return orig is not None and orig is not exc and _transient_without_code(orig)
    return _transient_without_code(exc)


def server_gone(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) carries a SQLSTATE saying the connection's server will
    not take this client's writes any more (``SERVER_GONE_SQLSTATES``, class ``08``): a
    failover, a shutdown, a server in recovery. The connection is no use for a retry."""
    code = sqlstate_of(exc)
    return code is not None and (code in SERVER_GONE_SQLSTATES or code.startswith("08"))


def _transient_without_code(exc: BaseException) -> bool:
    if isinstance(exc, OSError | PoolTimeoutError | DisconnectionError | ConnectionError):
        return True
    # asyncpg's own InterfaceError ("connection is closed", "another operation is in
    # progress"), raised outside SQLAlchemy's wrapping (connect, pool reset); no host of a
    # multi-host URL matching target_session_attrs (a failover not done yet)
    return type(exc).__module__.startswith("asyncpg") and type(exc).__name__.endswith(
        ("InterfaceError", "ConnectionError", "InternalClientError", "AttributeNotMatched")
    )


async def retry_transient(
    operation: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    what: str,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Await ``operation()`` until it succeeds, retrying transient failures (``is_transient``)
    with exponential backoff and jitter (from ``RETRY_INITIAL_S``, doubling up to
    ``RETRY_MAX_WAIT_S``, plus up to ``RETRY_INITIAL_S`` of random jitter; tenacity's
    ``wait_exponential`` + ``wait_random``).

    Args:
        operation: makes one attempt (a new coroutine each call).
        deadline: a ``time.monotonic()`` value after which no attempt starts; the wait
            before an attempt never crosses it.
        what: names the operation in the log lines (``"storing the iteration"``).
        stop: no further attempt once it returns True (e.g. the lease was found lost).

    Returns:
        What the first successful attempt returned.

    Raises:
        Whatever the last attempt raised: at once for a failure that is not transient, else
        when the deadline or ``stop`` ends the retries. The first attempt always runs, even
        past the deadline.
    """
    # The first attempt runs on its own: tenacity's loop around every statement a run sends
    # cost 5 % of the worker's CPU in bench/durable.py (py-spy), for retries that a healthy
    # database never needs. A transient failure hands over to tenacity, which sees it as its
    # own first attempt (the same log line, waits and stops as when it made that attempt).
    try:
        return await operation()
    except Exception as exc:
        if not is_transient(exc):
            raise
        first: BaseException | None = exc

    async def attempt() -> T:  # tenacity awaits only what it sees is a coroutine function
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return await operation()

    return await _retrying(deadline=deadline, what=what, stop=stop)(attempt)


def _retrying(*, deadline: float, what: str, stop: Callable[[], bool] | None) -> AsyncRetrying:
    """Tenacity's retry loop for ``retry_transient``: transient failures only, backoff with
    jitter, no attempt after ``deadline`` or once ``stop()``, a log line before each wait."""
    stops = [stop_before_delay(max(0.0, deadline - time.monotonic()))]
    if stop is not None:
        stops.append(stop_when_event_set(_Stop(stop)))  # type: ignore[arg-type]

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning(
            "%s failed (attempt %d: %s); retrying in %.2f s",
            what,
            state.attempt_number,
            _describe(exc),
            wait,
        )

    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_any(*stops),
        wait=wait_exponential(multiplier=RETRY_INITIAL_S, max=RETRY_MAX_WAIT_S)
        + wait_random(0, RETRY_INITIAL_S),
        before_sleep=log_retry,
        reraise=True,
    )


def _describe(exc: BaseException | None) -> str:
    return "no error" if exc is None else describe_error(exc)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of the root cause of a driver error, readable even when the
    message is empty (a bare ``TimeoutError``)."""
    cause: BaseException = exc
    while isinstance(cause, SQLAlchemyError):
        inner = cause.__cause__ or getattr(cause, "orig", None)  # the driver's error
        if not isinstance(inner, BaseException):
            break
        cause = inner
    detail = str(cause).strip()
    if isinstance(cause, TimeoutError) and not detail:
        detail = "no answer in time (is something else listening on that port?)"
    return f"{type(cause).__name__}: {detail}" if detail else type(cause).__name__


def refused_text(exc: BaseException) -> str:
    """What a tool's caller (the model, the stored call) reads of a database error that is
    not transient: ``the database refused it (DataError: invalid input for query argument $1:
    99999999999999999999 (value out of int64 range))``: the driver's reason
    (``describe_error``), never SQLAlchemy's text of the statement and its parameters."""
    return f"the database refused it ({describe_error(exc)})"
