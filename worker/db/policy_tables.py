"""The tables of the policy gate, approvals and access, as SQLAlchemy Core tables (part of
the schema in ``worker.db.tables``, which re-exports them): the users' policy settings, the
rate limit's ledger, approval requests, and the tokens and sessions of the API, the console
and the MCP server."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from worker.db.schema import (
    APPROVAL_STATUSES,
    CONSUMERS,
    check_in,
    metadata,
    timestamp,
)

__all__ = [
    "admin_sessions",
    "admin_tokens",
    "approval_requests",
    "mcp_tokens",
    "policy_call_events",
    "user_policy_settings",
]

mcp_tokens = Table(
    "mcp_tokens",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("label", Text, nullable=True),
    Column(
        "token_hash",
        Text,
        nullable=False,
        unique=True,
        comment="hex SHA-256 of the token; the token itself is never stored",
    ),
    timestamp("created_at", default_now=True),
    timestamp("revoked_at", nullable=True),
    Index("ix_mcp_tokens_user_id", "user_id"),
)

# MCP servers as tool sources of an agent (`mana-ai agents add|set --mcp NAME=...`).
user_policy_settings = Table(
    "user_policy_settings",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column(
        "destructive_opt_ins",
        ARRAY(Text),
        nullable=False,
        server_default=text("'{}'::text[]"),
        comment="tool names or scopes whose destructive tools the user allows",
    ),
    Column("rate_limit", Integer, nullable=True, comment="NULL: the operator's default"),
    Column(
        "tool_rate_limits",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="tool name -> calls per window, for this user",
    ),
    timestamp("updated_at", default_now=True),
    CheckConstraint("rate_limit IS NULL OR rate_limit >= 1", name="rate_limit_positive"),
)

# The rate limit's ledger: one row per call that took a slot, written and counted atomically
# by the SQL function mana_ai_reserve_tool_call (migration 0002, worker/queries/user_policy.py);
# rows older than the window are deleted as the same user and tool call again.
policy_call_events = Table(
    "policy_call_events",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("consumer", Text, nullable=False),
    timestamp("created_at"),
    Index("ix_policy_call_events_user_id_tool_created_at", "user_id", "tool", "created_at"),
)

# Approval requests: a destructive call the gate asked a person about (migration 0009), with
# the exact arguments and their hash, who asked, and the decision: who, when, why. Never
# deleted; the ids of the mission, iteration and agent are kept without foreign keys, so the
# audit outlives them. A mission's call is asked about once (its iteration, round and
# position); an MCP client's identical call has one pending request at a time.
approval_requests = Table(
    "approval_requests",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("consumer", Text, nullable=False, comment="mission or mcp"),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("user_id", Text, nullable=False, comment="whose space the call acts in"),
    Column("agent_id", BigInteger, nullable=True),
    Column("mission_id", BigInteger, nullable=True),
    Column("iteration_id", BigInteger, nullable=True),
    Column("attempt", Integer, nullable=True, comment="the attempt of the run that asked"),
    Column("round", Integer, nullable=True),
    Column("position", Integer, nullable=True),
    Column("call_id", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("arguments", JSONB, nullable=False, comment="exactly what the call would run with"),
    Column(
        "arguments_hash",
        Text,
        nullable=False,
        comment="hex SHA-256 of the arguments as canonical JSON (planner.approvals)",
    ),
    Column("reply_text", Text, nullable=True, comment="the model's text before the call"),
    Column("reason", Text, nullable=False, comment="why the gate asked"),
    Column(
        "mcp_token_id",
        BigInteger,
        nullable=True,
        comment="the token of the MCP client that called (NULL: a mission, or stdio)",
    ),
    timestamp("created_at", default_now=True),
    timestamp("expires_at"),
    Column("decided_by", Text, nullable=True),
    timestamp("decided_at", nullable=True),
    Column(
        "decision_note",
        Text,
        nullable=True,
        comment="the note of an approval, the reason of a denial or an expiry",
    ),
    Column(
        "used_at",
        DateTime(timezone=True),
        nullable=True,
        comment="when the approved call of an MCP client ran on it (allowed once)",
    ),
    Column(
        "target",
        Text,
        nullable=True,
        comment="what the call would act on, read back by its tool for the reviewer",
    ),
    CheckConstraint(check_in("status", APPROVAL_STATUSES), name="status"),
    CheckConstraint(check_in("consumer", CONSUMERS), name="consumer"),
    CheckConstraint(
        "consumer <> 'mission' OR (mission_id IS NOT NULL AND iteration_id IS NOT NULL "
        "AND round IS NOT NULL AND position IS NOT NULL)",
        name="mission_call",
    ),
    CheckConstraint("(status = 'pending') = (decided_at IS NULL)", name="decided_at"),
    Index(
        "uq_approval_requests_iteration_id_round_position",
        "iteration_id",
        "round",
        "position",
        unique=True,
        postgresql_where=text("consumer = 'mission'"),
    ),
    Index(
        "uq_approval_requests_user_id_tool_arguments_hash",
        "user_id",
        "tool",
        "arguments_hash",
        unique=True,
        postgresql_where=text("consumer = 'mcp' AND status = 'pending'"),
    ),
    Index(
        "ix_approval_requests_mission_id",
        "mission_id",
        postgresql_where=text("status = 'pending'"),
    ),
    Index("ix_approval_requests_status_created_at", "status", "created_at"),
)

# Bearer tokens of the HTTP API and console (`mana-ai admin token create NAME`, migration
# 0010): only the SHA-256 of each token is stored; a revoked token stays (revoked_at).
admin_tokens = Table(
    "admin_tokens",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, comment="who holds it; kept with what it decides"),
    Column(
        "name_key",
        Text,
        nullable=False,
        comment="the name compared: NFKC, case-folded (Alice and ALICE are one name)",
    ),
    Column(
        "token_hash",
        Text,
        nullable=False,
        unique=True,
        comment="hex SHA-256 of the token; the token itself is never stored",
    ),
    Column("read_only", Boolean, nullable=False, server_default=text("false")),
    timestamp("created_at", default_now=True),
    timestamp("revoked_at", nullable=True),
    timestamp("last_used_at", nullable=True),
    # a live token's name is who decides (approvals): two never share one
    Index(
        "uq_admin_tokens_live_name",
        "name_key",
        unique=True,
        postgresql_where=text("revoked_at IS NULL"),
    ),
)

# Console sessions: a browser signed in with an admin token keeps an HttpOnly cookie holding a
# random session id, of which only the SHA-256 is stored; it ends at expires_at, at sign-out,
# or when its token is revoked.
admin_sessions = Table(
    "admin_sessions",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "session_hash",
        Text,
        nullable=False,
        unique=True,
        comment="hex SHA-256 of the session id in the cookie",
    ),
    Column(
        "token_id",
        BigInteger,
        ForeignKey("admin_tokens.id", ondelete="CASCADE"),
        nullable=False,
    ),
    timestamp("created_at", default_now=True),
    timestamp("expires_at"),
    timestamp("ended_at", nullable=True),
    Index("ix_admin_sessions_token_id", "token_id"),
)

# The compaction archive: what each compaction of an iteration's context folded, verbatim.
