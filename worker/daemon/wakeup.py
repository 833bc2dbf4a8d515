"""Wake-ups: LISTEN for the database's "a mission is due now" and ask the worker for a tick.

Migration 0007 puts a trigger on ``missions`` that sends ``NOTIFY mana_ai_due`` (empty
payload) when a row written by an INSERT or UPDATE is claimable at once: active, due, no live
lease (``missions add --due-now``, ``missions resume``, a lease released by an interrupted run,
any other client's insert). ``WakeUpListener`` holds one connection of the engine's pool for
the daemon's life, LISTENs on that channel and calls ``Worker.wake()`` for each notification;
the worker's tick loop (``Worker.run``) turns that into a tick within milliseconds. The tick
interval stays the safety net: a notification sent while no listener is connected is lost, so
the listener wakes the worker once after each reconnection.

A failover ends the listening connection (the old primary stops, or restarts as a standby:
PostgreSQL demotes no server online), and the listener reconnects like after any loss; with a
multi-host URL and ``target_session_attrs=read-write`` it reaches the new primary. It never
listens on a standby: PostgreSQL refuses LISTEN during recovery ("cannot execute LISTEN during
recovery"), so a listener whose connection reaches one keeps retrying.

LISTEN needs a session of its own, which PgBouncer in transaction pooling mode does not give
(its documentation lists LISTEN among the features that do not work there); ``off_reason``
says when wake-ups are off and why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker.db.tables import DUE_CHANNEL
from worker.db.transient import describe_error

__all__ = ["WAKE_UP_CHANNEL", "WakeUpListener", "off_reason"]

logger = logging.getLogger(__name__)

WAKE_UP_CHANNEL = DUE_CHANNEL
"""The channel of migration 0007's trigger (``migrations/versions/0007_due_notify.py``)."""


def off_reason(
    *, wake_up: bool, pgbouncer: bool, pool_capacity: int, pgbouncer_detected: bool = False
) -> str | None:
    """Why wake-ups are off, or ``None`` when the worker should listen.

    Args:
        wake_up: ``MANA_AI_WAKE_UP``.
        pgbouncer: the database is reached through PgBouncer in transaction mode (no LISTEN).
        pool_capacity: ``MANA_AI_DB_POOL_SIZE + MANA_AI_DB_MAX_OVERFLOW``; the listener holds
            one of them, so it needs at least 2 to leave one for the missions.
        pgbouncer_detected: PgBouncer was assumed from the URL's port 6432
            (``MANA_AI_DB_PGBOUNCER=auto``), not set.
    """
    if not wake_up:
        return "MANA_AI_WAKE_UP=false"
    if pgbouncer and pgbouncer_detected:
        return (
            "PgBouncer transaction mode assumed from the database URL's port 6432 "
            "(MANA_AI_DB_PGBOUNCER=auto; set it to false for plain PostgreSQL on that port): "
            "LISTEN needs a session"
        )
    if pgbouncer:
        return "PgBouncer transaction mode, MANA_AI_DB_PGBOUNCER: LISTEN needs a session"
    if pool_capacity < 2:
        return (
            f"MANA_AI_DB_POOL_SIZE + MANA_AI_DB_MAX_OVERFLOW = {pool_capacity}: listening "
            "would hold the only connection"
        )
    return None


class WakeUpListener:
    """LISTEN on ``channel`` over a connection of ``engine``'s pool; call ``on_notify()``
    for each notification (and once after each reconnection, for those it may have missed).

    Run ``run()`` as a task for the daemon's life and cancel it at shutdown: it UNLISTENs and
    gives the connection back to the pool before it returns. It never raises for a database
    failure: a lost connection (server restart, ``pg_terminate_backend``, a network cut that a
    ``SELECT 1`` every ``check_every_s`` seconds notices) is logged once as a warning, and it
    reconnects with exponential backoff from ``retry_min_s`` to ``retry_max_s`` seconds,
    logging the recovery once.

    Args:
        engine: the worker's engine; the listener holds one of its pooled connections.
        on_notify: called on the event loop; must not block (``Worker.wake``).
        channel: the LISTEN channel (default ``WAKE_UP_CHANNEL``).
        check_every_s: seconds between liveness checks of an idle listening connection.
        retry_min_s, retry_max_s: the reconnection backoff's first and largest delay.

    Attributes:
        listening: set while the LISTEN is in place (tests wait on it).
        backend_pid: the listening connection's PostgreSQL backend pid, or ``None``.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        on_notify: Callable[[], None],
        *,
        channel: str = WAKE_UP_CHANNEL,
        check_every_s: float = 30.0,
        retry_min_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        self.engine = engine
        self.on_notify = on_notify
        self.channel = channel
        self.check_every_s = check_every_s
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self.listening = asyncio.Event()
        self.backend_pid: int | None = None
        self._lost = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting whenever the connection is lost."""
        loop = asyncio.get_running_loop()
        delay = self.retry_min_s
        lost_at: float | None = None  # since when nobody listens (None: listening, or never)
        first = True
        while True:
            reason: str
            try:
                conn = await self.engine.connect()
            except Exception as exc:
                reason = f"cannot connect: {describe_error(exc)}"
            else:
                try:
                    driver = await self._listen(conn)
                    if first:
                        logger.info("wake-ups: listening on channel %s", self.channel)
                        first = False
                    elif lost_at is not None:
                        logger.info(
                            "wake-ups: listening again on channel %s after %.1f s",
                            self.channel,
                            loop.time() - lost_at,
                        )
                    if lost_at is not None:
                        self.on_notify()  # missions may have become due while nobody listened
                    lost_at = None
                    delay = self.retry_min_s
                    reason = await self._watch(driver)
                except Exception as exc:
                    reason = describe_error(exc)
                except BaseException:  # cancelled: the daemon stops
                    await self._close(conn)
                    raise
                self.listening.clear()
                self.backend_pid = None
                await _discard(conn)
            if lost_at is None:
                lost_at = loop.time()
                logger.warning(
                    "wake-ups: not listening (%s); retrying, due missions wait for the tick "
                    "meanwhile",
                    reason,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    async def _listen(self, conn: AsyncConnection) -> asyncpg.Connection:
        """LISTEN on ``conn``'s asyncpg connection, which it returns."""
        raw = await conn.get_raw_connection()
        driver: asyncpg.Connection = raw.driver_connection
        self._lost.clear()
        driver.add_termination_listener(self._on_termination)
        await driver.add_listener(self.channel, self._on_notification)
        self.backend_pid = driver.get_server_pid()
        self.listening.set()
        return driver

    async def _watch(self, driver: asyncpg.Connection) -> str:
        """Wait until the connection is lost; return why. A ``SELECT 1`` every
        ``check_every_s`` seconds (answered within as long) catches a silently dead peer."""
        while True:
            try:
                await asyncio.wait_for(self._lost.wait(), self.check_every_s)
            except TimeoutError:
                try:
                    await asyncio.wait_for(driver.fetchval("SELECT 1"), self.check_every_s)
                except TimeoutError:
                    return f"no answer to SELECT 1 within {self.check_every_s:g} s"
            else:
                return "the server closed the connection"

    async def _close(self, conn: AsyncConnection) -> None:
        """UNLISTEN and give the connection back to the pool (invalidated if it is broken)."""
        self.listening.clear()
        self.backend_pid = None
        try:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            if driver is None:  # never connected
                await conn.close()
                return
            driver.remove_termination_listener(self._on_termination)
            if driver.is_closed():
                await _discard(conn)
                return
            await driver.remove_listener(self.channel, self._on_notification)  # UNLISTEN
            await conn.close()
        except Exception as exc:
            logger.debug("wake-ups: closing the listening connection: %s", describe_error(exc))
            await _discard(conn)

    def _on_notification(self, *_: Any) -> None:
        self.on_notify()

    def _on_termination(self, *_: Any) -> None:
        self._lost.set()


async def _discard(conn: AsyncConnection) -> None:
    """Drop a broken connection from the pool (its slot is free again)."""
    try:
        await conn.invalidate()
        await conn.close()
    except Exception as exc:
        logger.debug("wake-ups: discarding the listening connection: %s", describe_error(exc))
