"""The policy gate's tables: user settings, the rate-limit ledger, and the rollout report.

* ``PostgresCallLedger`` implements ``planner.gate.CallLedger`` with the SQL function
  ``mana_ai_reserve_tool_call`` (migration 0002), which takes a transaction advisory lock per
  (user, tool), counts the calls in the rolling window, and records one when fewer than the
  limit — so any number of replicas share the limit exactly. Reservations that wait together
  go to the database together, through its set-based twin ``mana_ai_reserve_tool_calls``
  (migration 0008): a burst of 500 calls costs a few statements of milliseconds each. It runs
  in autocommit, or inside BEGIN … COMMIT under PgBouncer (see the class).
  Its predicate (``count(created_at > now - window) < limit``) is the one of
  ``planner.policy.rate_limit_wait``.
* ``PolicyStore`` reads and writes ``user_policy_settings`` (the ``mana-ai policy`` commands)
  and builds the rollout report from ``tool_invocations``.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.gate import Reservation
from planner.policy import RateLimit, UserPolicySettings
from worker.store.engine import run_statement
from worker.store.tables import agents, tool_invocations, user_policy_settings

__all__ = [
    "PolicyReport",
    "PolicyStore",
    "PostgresCallLedger",
    "user_settings_from_row",
]

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

    The statement runs with ``worker.store.engine.run_statement``: in autocommit directly on
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


def user_settings_from_row(row: Mapping[str, Any] | None) -> UserPolicySettings:
    """``UserPolicySettings`` from a ``user_policy_settings`` row (or its JSON form); ``None``
    (no row) gives the defaults. Malformed per-tool entries are skipped."""
    if not row:
        return UserPolicySettings()
    limits = row.get("tool_rate_limits") or {}
    return UserPolicySettings(
        destructive_opt_ins=frozenset(row.get("destructive_opt_ins") or ()),
        rate_limit=row.get("rate_limit"),
        tool_rate_limits={
            str(k): int(v) for k, v in limits.items() if isinstance(v, int) and v >= 1
        },
    )


@dataclass(frozen=True)
class PolicyReport:
    """Policy decisions of the tool calls since ``since``, for the log-only → enforce switch.

    Attributes:
        since: the start of the period (database clock).
        calls: every tool call in the period, decided or not (mode ``off``, unknown tools and
            invalid arguments carry no decision).
        decided: calls that carry a decision.
        by_mode: ``mode -> {"calls", "allowed", "denied", "flagged"}``; in ``log-only``,
            ``denied`` counts would-be denials (the calls ran).
        by_reason: ``(mode, reason) -> calls``.
        by_tool: ``(mode, tool) -> {"calls", "denied"}``.
        injection_flags: ``tool -> calls`` flagged with injection markers.
        by_consumer: ``(consumer, mode) -> {"calls", "allowed", "denied", "flagged"}``:
            missions' calls and MCP clients' calls apart (the other counts hold both).
    """

    since: datetime
    calls: int
    decided: int
    by_mode: dict[str, dict[str, int]] = field(default_factory=dict)
    by_reason: dict[tuple[str, str], int] = field(default_factory=dict)
    by_tool: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    injection_flags: dict[str, int] = field(default_factory=dict)
    by_consumer: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)

    @property
    def would_deny_share(self) -> float | None:
        """Would-be denials among the ``log-only`` calls (0..1), or ``None`` without any."""
        log_only = self.by_mode.get("log-only")
        if not log_only or not log_only["calls"]:
            return None
        return log_only["denied"] / log_only["calls"]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (tuple keys flattened into lists of objects)."""
        return {
            "since": self.since.isoformat(),
            "calls": self.calls,
            "decided": self.decided,
            "by_mode": self.by_mode,
            "by_reason": [
                {"mode": m, "reason": r, "calls": n} for (m, r), n in sorted(self.by_reason.items())
            ],
            "by_tool": [
                {"mode": m, "tool": t, **counts} for (m, t), counts in sorted(self.by_tool.items())
            ],
            "injection_flags": self.injection_flags,
            "by_consumer": [
                {"consumer": c, "mode": m, **counts}
                for (c, m), counts in sorted(self.by_consumer.items())
            ],
            "would_deny_share": self.would_deny_share,
        }


class PolicyStore:
    """``user_policy_settings`` reads and writes, and the rollout report, over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def get(self, user_id: str) -> dict[str, Any] | None:
        """The user's settings row, or ``None`` when the user has none (defaults apply)."""
        async with self.engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(user_policy_settings).where(
                            user_policy_settings.c.user_id == user_id
                        )
                    )
                )
                .mappings()
                .first()
            )
        return dict(row) if row is not None else None

    async def owns_agents(self, user_id: str) -> bool:
        """True when an agent has ``user_id`` as its owner."""
        stmt = select(agents.c.id).where(agents.c.owner_user_id == user_id).limit(1)
        async with self.engine.connect() as conn:
            return (await conn.execute(stmt)).first() is not None

    async def user_settings(self, user_id: str) -> UserPolicySettings:
        """The user's settings as the gate takes them."""
        return user_settings_from_row(await self.get(user_id))

    async def allow_destructive(self, user_id: str, target: str) -> dict[str, Any]:
        """Add ``target`` (a tool name or scope) to the user's opt-ins (idempotent)."""
        column = user_policy_settings.c.destructive_opt_ins
        merged = case((column.contains([target]), column), else_=func.array_append(column, target))
        return await self._upsert(
            user_id, {"destructive_opt_ins": [target]}, {"destructive_opt_ins": merged}
        )

    async def revoke_destructive(self, user_id: str, target: str) -> dict[str, Any]:
        """Remove ``target`` from the user's opt-ins (idempotent)."""
        column = user_policy_settings.c.destructive_opt_ins
        return await self._upsert(
            user_id,
            {"destructive_opt_ins": []},
            {"destructive_opt_ins": func.array_remove(column, target)},
        )

    async def set_rate_limit(
        self, user_id: str, calls: int | None, *, tool: str | None = None
    ) -> dict[str, Any]:
        """Set (``calls``) or clear (``None``) the user's rate limit, for ``tool`` or for
        every tool."""
        if tool is None:
            return await self._upsert(user_id, {"rate_limit": calls}, {"rate_limit": calls})
        column = user_policy_settings.c.tool_rate_limits
        if calls is None:
            return await self._upsert(
                user_id, {"tool_rate_limits": {}}, {"tool_rate_limits": column.op("-")(tool)}
            )
        entry = func.jsonb_build_object(tool, calls)
        return await self._upsert(
            user_id,
            {"tool_rate_limits": {tool: calls}},
            {"tool_rate_limits": column.op("||")(entry)},
        )

    async def _upsert(
        self, user_id: str, insert_values: dict[str, Any], update_values: dict[str, Any]
    ) -> dict[str, Any]:
        stmt = (
            pg_insert(user_policy_settings)
            .values(user_id=user_id, **insert_values)
            .on_conflict_do_update(
                index_elements=["user_id"], set_={**update_values, "updated_at": func.now()}
            )
            .returning(*user_policy_settings.c)
        )
        async with self.engine.begin() as conn:
            return dict((await conn.execute(stmt)).mappings().one())

    async def report(self, *, since: timedelta) -> PolicyReport:
        """Decisions of the tool calls of every consumer (missions, MCP clients) created within
        ``since`` before now (database clock)."""
        decision = tool_invocations.c.policy_decision
        mode = func.coalesce(tool_invocations.c.policy_mode, decision["mode"].astext)
        verdict = decision["verdict"].astext
        reason = decision["reason"].astext
        flagged = decision["flags"].op("?")(literal_column("'injection_marker'"))
        # decided: a decision object (rows of mode off, unknown tools and invalid arguments
        # have none: SQL NULL, or JSON null in rows written by earlier versions)
        is_decided = func.coalesce(func.jsonb_typeof(decision) == "object", False)
        stmt = (
            select(
                tool_invocations.c.consumer,
                mode.label("mode"),
                tool_invocations.c.tool,
                reason.label("reason"),
                verdict.label("verdict"),
                is_decided.label("decided"),
                func.count().label("calls"),
                func.count().filter(flagged).label("flagged"),
                func.now().label("now"),
            )
            .where(tool_invocations.c.created_at >= func.now() - since)
            .group_by(
                tool_invocations.c.consumer,
                mode,
                tool_invocations.c.tool,
                reason,
                verdict,
                is_decided,
            )
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
            now = rows[0]["now"] if rows else (await conn.execute(select(func.now()))).scalar_one()
        by_mode: dict[str, Counter[str]] = defaultdict(Counter)
        by_reason: Counter[tuple[str, str]] = Counter()
        by_tool: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        by_consumer: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        flags: Counter[str] = Counter()
        calls = decided = 0
        for row in rows:
            n = row["calls"]
            calls += n
            if not row["decided"]:
                continue
            decided += n
            m = row["mode"] or "unknown"
            denied = n if row["verdict"] == "deny" else 0
            counts = {
                "calls": n,
                "denied": denied,
                "allowed": n - denied,
                "flagged": row["flagged"],
            }
            by_mode[m].update(counts)
            by_consumer[(row["consumer"], m)].update(counts)
            by_reason[(m, row["reason"] or "unknown")] += n
            by_tool[(m, row["tool"])].update({"calls": n, "denied": denied})
            if row["flagged"]:
                flags[row["tool"]] += row["flagged"]
        return PolicyReport(
            since=now - since,
            calls=calls,
            decided=decided,
            by_mode={
                m: {k: c[k] for k in ("calls", "allowed", "denied", "flagged")}
                for m, c in sorted(by_mode.items())
            },
            by_reason=dict(by_reason),
            by_tool={k: {"calls": c["calls"], "denied": c["denied"]} for k, c in by_tool.items()},
            injection_flags=dict(flags),
            by_consumer={
                k: {f: c[f] for f in ("calls", "allowed", "denied", "flagged")}
                for k, c in by_consumer.items()
            },
        )
