"""The users' policy settings and the rollout report: ``PolicyStore`` reads and writes
``user_policy_settings`` (the ``mana-ai policy`` commands) and builds the report of the gate's
decisions from ``tool_invocations``. The rate-limit ledger is ``worker.store.ledger``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, literal_column, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.policy import DecisionReason, UserPolicySettings
from worker.db.tables import agents, approval_requests, tool_invocations, user_policy_settings
from worker.queries.approval_status import current_status
from worker.store.records import user_settings_from_row

__all__ = [
    "PolicyReport",
    "PolicyStore",
    "user_settings_from_row",
]


@dataclass(frozen=True)
class PolicyReport:
    """Policy decisions of the tool calls since ``since``, for the log-only → enforce switch.

    Attributes:
        since: the start of the period (database clock).
        calls: every tool call in the period, decided or not (mode ``off``, unknown tools and
            invalid arguments carry no decision).
        decided: calls that carry a decision.
        by_mode: ``mode -> {"calls", "allowed", "denied", "asked", "flagged"}``; in
            ``log-only``, ``denied`` counts would-be denials (the calls ran).
        by_reason: ``(mode, reason) -> calls``.
        by_tool: ``(mode, tool) -> {"calls", "denied"}``.
        injection_flags: ``tool -> calls`` flagged with injection markers.
        by_consumer: ``(consumer, mode) -> {"calls", "allowed", "denied", "flagged"}``:
            missions' calls and MCP clients' calls apart (the other counts hold both).
        approvals: the approval requests asked in the period, by status as it stands now
            (``pending``, ``approved``, ``denied``, ``expired``; missing ones: none). In
            ``by_mode``, ``asked`` counts the calls that were asked of a person, whatever came
            of it: still waiting, or decided since (approved, denied, expired; in ``log-only``:
            would-be asks, the calls ran); ``allowed`` and ``denied`` count the final decision,
            so a call approved since counts as allowed and asked.
    """

    since: datetime
    calls: int
    decided: int
    by_mode: dict[str, dict[str, int]] = field(default_factory=dict)
    by_reason: dict[tuple[str, str], int] = field(default_factory=dict)
    by_tool: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    injection_flags: dict[str, int] = field(default_factory=dict)
    by_consumer: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    approvals: dict[str, int] = field(default_factory=dict)

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
            "approvals": self.approvals,
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

    async def daily_would_deny(self, *, since: timedelta) -> list[dict[str, Any]]:
        """Per UTC day within ``since`` before now: the ``log-only`` calls the gate decided
        (``calls``) and how many it would have denied (``would_deny``), oldest day first: the
        would-be deny share over time, the rollout's switch criterion (under 1 %)."""
        calls = tool_invocations.c
        decision = calls.policy_decision
        mode = func.coalesce(calls.policy_mode, decision["mode"].astext)
        day = func.date_trunc("day", func.timezone("UTC", calls.created_at)).label("day")
        stmt = (
            select(
                day,
                func.count().label("calls"),
                func.count().filter(decision["verdict"].astext == "deny").label("would_deny"),
            )
            .where(
                calls.created_at >= func.now() - since,
                mode == "log-only",
                func.jsonb_typeof(decision) == "object",
            )
            .group_by(day)
            .order_by(day)
        )
        async with self.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    async def report(self, *, since: timedelta) -> PolicyReport:
        """Decisions of the tool calls of every consumer (missions, MCP clients) created within
        ``since`` before now (database clock)."""
        status = current_status()
        asked = (
            select(status, func.count())
            .where(approval_requests.c.created_at >= func.now() - since)
            .group_by(status)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(_decisions(since))).mappings().all()
            now = rows[0]["now"] if rows else (await conn.execute(select(func.now()))).scalar_one()
            approvals = {str(k): int(n) for k, n in (await conn.execute(asked)).all()}
        return _tally(rows, since=now - since, approvals=approvals)


_DECIDED_BY_A_PERSON = frozenset(
    str(r)
    for r in (
        DecisionReason.APPROVED,
        DecisionReason.APPROVAL_DENIED,
        DecisionReason.APPROVAL_EXPIRED,
    )
)
"""The final reasons of a call a person was asked about."""


def _decisions(since: timedelta) -> Any:
    """The tool calls created within ``since`` counted by consumer, mode, tool, reason,
    verdict and whether they carry a decision (with the flagged ones and the database's now)."""
    decision = tool_invocations.c.policy_decision
    mode = func.coalesce(tool_invocations.c.policy_mode, decision["mode"].astext)
    verdict = decision["verdict"].astext
    reason = decision["reason"].astext
    flagged = decision["flags"].op("?")(literal_column("'injection_marker'"))
    # decided: a decision object (rows of mode off, unknown tools and invalid arguments
    # have none: SQL NULL, or JSON null in rows written by earlier versions)
    is_decided = func.coalesce(func.jsonb_typeof(decision) == "object", False)
    return (
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
            tool_invocations.c.consumer, mode, tool_invocations.c.tool, reason, verdict, is_decided
        )
    )


def _tally(
    rows: Sequence[Mapping[Any, Any]], *, since: datetime, approvals: dict[str, int]
) -> PolicyReport:
    """The report of the counted decisions (``_decisions``' rows)."""
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
        waiting = n if row["verdict"] == "ask" else 0
        counts = {
            "calls": n,
            "denied": denied,
            "asked": n if waiting or row["reason"] in _DECIDED_BY_A_PERSON else 0,
            "allowed": n - denied - waiting,
            "flagged": row["flagged"],
        }
        by_mode[m].update(counts)
        by_consumer[(row["consumer"], m)].update(counts)
        by_reason[(m, row["reason"] or "unknown")] += n
        by_tool[(m, row["tool"])].update({"calls": n, "denied": denied})
        if row["flagged"]:
            flags[row["tool"]] += row["flagged"]
    return PolicyReport(
        since=since,
        calls=calls,
        decided=decided,
        by_mode={
            m: {k: c[k] for k in ("calls", "allowed", "denied", "asked", "flagged")}
            for m, c in sorted(by_mode.items())
        },
        by_reason=dict(by_reason),
        by_tool={k: {"calls": c["calls"], "denied": c["denied"]} for k, c in by_tool.items()},
        injection_flags=dict(flags),
        by_consumer={
            k: {f: c[f] for f in ("calls", "allowed", "denied", "flagged")}
            for k, c in by_consumer.items()
        },
        approvals=approvals,
    )
