"""The policy gate's rate-limit ledger in PostgreSQL, shared by every replica on the database.

``PostgresCallLedger`` implements ``planner.gate.CallLedger`` with the SQL function
``mana_ai_reserve_tool_call`` (migration 0002), which takes a transaction advisory lock per
(user, tool), counts the calls in the rolling window, and records one when fewer than the
limit — so any number of replicas share the limit exactly. Reservations that wait together go
to the database together, through its set-based twin ``mana_ai_reserve_tool_calls`` (migration
0008): a burst of 500 calls costs a few statements of milliseconds each. It runs in autocommit,
or inside BEGIN … COMMIT under PgBouncer (see the class). Its predicate
(``count(created_at > now - window) < limit``) is the one of ``planner.policy.rate_limit_wait``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.gate import Reservation
from planner.policy import RateLimit
from worker.db.engine import run_statement

__all__ = ["MAX_BATCH", "PostgresCallLedger"]


_RESERVE = text(
    "SELECT reserved, checked_at, recent "
    "FROM mana_ai_reserve_tool_call(:user_id, :tool, :consumer, :window, :limit)"
)

# One statement for a batch (migration 0008): the rule of the single call, set-based, with the
# advisory locks of every key of the batch taken in one order.
_RESERVE_MANY = text(
    "SELECT ord, reserved, checked_at, recent FROM mana_ai_reserve_tool_calls("
    "CAST(:users AS text[]), CAST(:tools AS text[]), CAST(:consumers AS text[]), "
    "CAST(:windows AS interval[]), CAST(:limits AS integer[]))"
)

MAX_BATCH = 500
"""Reservations one statement makes at most."""


@dataclass
class _Waiting:
    """A reservation waiting for its batch."""

    user_id: str
    tool: str
    consumer: str
    limit: RateLimit
    answer: asyncio.Future[Reservation]


class PostgresCallLedger:
    """A ``CallLedger`` in PostgreSQL, shared by every replica on the database.

    The database clock stamps the slots, so replicas with skewed clocks agree. The advisory
    lock is transaction-level, so no session state outlives a reservation.

    Reservations are batched without waiting for one another: the first goes to the database
    at once; those that arrive while a statement is under way go together in the next one
    (at most ``MAX_BATCH``, in the order they came; the function takes their advisory locks in
    one order, so two replicas' batches never wait for each other in a cycle). A failed
    statement fails every reservation of its batch with the same exception.

    The statement runs with ``worker.db.engine.run_statement``: in autocommit directly on
    PostgreSQL; inside BEGIN … COMMIT behind PgBouncer in transaction pooling mode, where
    PgBouncer may otherwise hand the prepare and the execute to different server connections
    ('prepared statement "__asyncpg_…__" does not exist'); once more on another connection
    when the one it got turns out broken (a call then counts twice at worst, if the first run
    had committed).

    Args:
        engine: the database; the worker gives the ledger a connection of its own (the gate
            lane, ``worker.daemon.app``), so that reservations never wait behind the missions'
            statements for a pooled connection.
        timeout_s: how long one reservation may take, waiting for its batch and connecting
            included (default 5 s); past it the call raises ``TimeoutError`` and the gate
            fails closed (``enforce``) or open (``log-only``) at once instead of waiting for
            the connect timeout. A slot its batch takes afterwards counts against the limit
            (a conservative miscount).
    """

    def __init__(self, engine: AsyncEngine, *, timeout_s: float = 5.0) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.statements = 0
        self._waiting: list[_Waiting] = []
        self._flusher: asyncio.Task[None] | None = None

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        """See ``planner.gate.CallLedger.reserve``. Raises SQLAlchemy/OS errors when the
        database is unavailable, ``TimeoutError`` past ``timeout_s``."""
        answer: asyncio.Future[Reservation] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(user_id, tool, consumer, limit, answer))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="policy-ledger")
        async with asyncio.timeout(self.timeout_s):
            return await asyncio.shield(answer)

    async def _flush(self) -> None:
        while self._waiting:
            batch = self._waiting[:MAX_BATCH]
            del self._waiting[:MAX_BATCH]
            try:
                answers = await self._reserve_many(batch)
            except Exception as exc:
                for waiting in batch:
                    if not waiting.answer.done():
                        waiting.answer.set_exception(exc)
                        waiting.answer.exception()  # retrieved: a waiter may have timed out
                continue
            for waiting, reservation in zip(batch, answers, strict=True):
                if not waiting.answer.done():
                    waiting.answer.set_result(reservation)

    async def _reserve_many(self, batch: list[_Waiting]) -> list[Reservation]:
        self.statements += 1
        if len(batch) == 1:
            [one] = batch
            params: dict[str, Any] = {
                "user_id": one.user_id,
                "tool": one.tool,
                "consumer": one.consumer,
                "window": one.limit.window,
                "limit": one.limit.calls,
            }
            rows = await run_statement(self.engine, _RESERVE, params)
        else:
            params = {
                "users": [w.user_id for w in batch],
                "tools": [w.tool for w in batch],
                "consumers": [w.consumer for w in batch],
                "windows": [w.limit.window for w in batch],
                "limits": [w.limit.calls for w in batch],
            }
            rows = await run_statement(self.engine, _RESERVE_MANY, params)  # in batch order
        return [
            Reservation(
                reserved=bool(row["reserved"]),
                now=row["checked_at"],
                recent=tuple(row["recent"] or ()),
            )
            for row in rows
        ]
