"""The PostgreSQL schema as SQLAlchemy Core tables: the model that migrations must produce.

``tests/integration/test_migrations.py`` compares the migrated database against ``metadata``,
so a change here needs a new migration in ``migrations/versions/`` (written by hand) and vice
versa.

The run's tables are here; the policy gate's, approvals' and access tables are in
``worker.db.policy_tables`` and the shared metadata, conventions and status values in
``worker.db.schema``, all re-exported here.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Interval,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from worker.db.policy_tables import (
    admin_sessions,
    admin_tokens,
    approval_requests,
    mcp_tokens,
    policy_call_events,
    user_policy_settings,
)
from worker.db.schema import (
    APPROVAL_STATUSES,
    CATCH_UP_POLICIES,
    CONSUMERS,
    DESTRUCTIVE_POLICIES,
    DUE_CHANNEL,
    ITERATION_STATUSES,
    MCP_TRANSPORTS,
    MISSION_STATUSES,
    NAMING_CONVENTION,
    POLICY_MODES,
    TOOL_OUTCOMES,
    check_in,
    metadata,
    timestamp,
)

__all__ = [
    "APPROVAL_STATUSES",
    "CONSUMERS",
    "DESTRUCTIVE_POLICIES",
    "DUE_CHANNEL",
    "MCP_TRANSPORTS",
    "MISSION_STATUSES",
    "NAMING_CONVENTION",
    "POLICY_MODES",
    "TOOL_OUTCOMES",
    "admin_sessions",
    "admin_tokens",
    "agent_mcp_servers",
    "agents",
    "approval_requests",
    "compacted_turns",
    "mcp_tokens",
    "metadata",
    "mission_iterations",
    "missions",
    "notes",
    "policy_call_events",
    "tool_invocations",
    "user_policy_settings",
]

agents = Table(
    "agents",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("owner_user_id", Text, nullable=False),
    Column("model", Text, nullable=True, comment="NULL: the daemon's default model"),
    Column("system_prompt", Text, nullable=False),
    Column("max_rounds", Integer, nullable=False, server_default=text("5")),
    Column("max_tokens_per_day", Integer, nullable=True, comment="NULL: no daily token budget"),
    Column("allowed_tools", ARRAY(Text), nullable=True, comment="NULL: all built-in tools"),
    timestamp("created_at", default_now=True),
    Column("policy_mode", Text, nullable=True, comment="NULL: the daemon's MANA_AI_POLICY_MODE"),
    Column(
        "compact_max_ctx",
        Integer,
        nullable=True,
        comment="NULL: MANA_AI_COMPACT_MAX_CTX; 0: never compact",
    ),
    CheckConstraint("max_rounds >= 1", name="max_rounds_positive"),
    CheckConstraint("compact_max_ctx IS NULL OR compact_max_ctx >= 0", name="compact_max_ctx"),
    CheckConstraint(
        f"policy_mode IS NULL OR {check_in('policy_mode', POLICY_MODES)}", name="policy_mode"
    ),
    Column(
        "destructive_policy",
        Text,
        nullable=True,
        comment="NULL: the daemon's MANA_AI_POLICY_DESTRUCTIVE; deny or ask",
    ),
    CheckConstraint(
        f"destructive_policy IS NULL OR {check_in('destructive_policy', DESTRUCTIVE_POLICIES)}",
        name="destructive_policy",
    ),
)

missions = Table(
    "missions",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "agent_id",
        BigInteger,
        ForeignKey("agents.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("objective", Text, nullable=False),
    Column("cron", Text, nullable=True, comment="5-field cron expression; NULL: one-shot"),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("status", Text, nullable=False, server_default=text("'active'")),
    timestamp("next_run_at", nullable=True),
    Column("lease_owner", Text, nullable=True),
    timestamp("lease_expires_at", nullable=True),
    timestamp("deadline", nullable=True),
    Column("last_error", Text, nullable=True),
    timestamp("created_at", default_now=True),
    timestamp("updated_at", default_now=True),
    Column(
        "catch_up",
        Text,
        nullable=False,
        server_default=text("'once'"),
        comment="missed runs: skip | once | all (within catch_up_window)",
    ),
    Column(
        "catch_up_window",
        Interval,
        nullable=True,
        comment="catch_up all: how far back missed runs still run (NULL: one day)",
    ),
    CheckConstraint(check_in("status", MISSION_STATUSES), name="status"),
    CheckConstraint(check_in("catch_up", CATCH_UP_POLICIES), name="catch_up"),
    CheckConstraint(
        "catch_up_window IS NULL OR catch_up_window > interval '0'", name="catch_up_window"
    ),
    Index(
        "ix_missions_due",
        "next_run_at",
        postgresql_where=text("status = 'active'"),
    ),
)

mission_iterations = Table(
    "mission_iterations",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "mission_id",
        BigInteger,
        ForeignKey("missions.id", ondelete="CASCADE"),
        nullable=False,
    ),
    timestamp("scheduled_for"),
    Column("status", Text, nullable=False),
    Column("attempt", Integer, nullable=False, server_default=text("1")),
    Column("messages", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column(
        "reminders",
        JSONB,
        nullable=False,
        server_default=text("'[]'::jsonb"),
        comment="reminders sent with each request: [{round, producer, text}]",
    ),
    Column(
        "attempts",
        JSONB,
        nullable=False,
        server_default=text("'[]'::jsonb"),
        comment="each attempt: [{attempt, worker_id, started_at, resumed_after_round}]",
    ),
    Column("rounds", Integer, nullable=False, server_default=text("0")),
    Column("prompt_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("completion_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("stop_reason", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("worker_id", Text, nullable=False),
    Column("model", Text, nullable=True),
    timestamp("started_at", default_now=True),
    timestamp("finished_at", nullable=True),
    UniqueConstraint("mission_id", "scheduled_for"),
    CheckConstraint(check_in("status", ITERATION_STATUSES), name="status"),
    Index("ix_mission_iterations_mission_id_started_at", "mission_id", "started_at"),
)

# Every tool call of every consumer: a mission's (with its iteration, mission and round) and
# an MCP client's (consumer 'mcp': no iteration; the token it came with).
tool_invocations = Table(
    "tool_invocations",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "iteration_id",
        BigInteger,
        ForeignKey("mission_iterations.id", ondelete="CASCADE"),
        nullable=True,
        comment="NULL for a call of an MCP client",
    ),
    Column("mission_id", BigInteger, nullable=True),
    Column("user_id", Text, nullable=False),
    Column("attempt", Integer, nullable=False, server_default=text("1")),
    Column("round", Integer, nullable=True),
    Column(
        "position",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="0-based position of the call in its assistant message",
    ),
    Column("call_id", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("arguments", JSONB, nullable=False),
    Column("result", JSONB, nullable=True),
    Column("error", Text, nullable=True),
    Column("outcome", Text, nullable=False),
    Column("policy_decision", JSONB, nullable=True),
    Column("policy_mode", Text, nullable=True),
    Column("idempotency_key", Text, nullable=True, comment="write and destructive calls"),
    Column("duration_ms", Double, nullable=False, server_default=text("0")),
    timestamp("created_at", default_now=True),
    Column("consumer", Text, nullable=False, server_default=text("'mission'")),
    Column(
        "mcp_token_id",
        BigInteger,
        ForeignKey("mcp_tokens.id", ondelete="SET NULL"),
        nullable=True,
        comment="the token an MCP client called with (NULL: a mission, or mcp serve --stdio)",
    ),
    CheckConstraint(check_in("outcome", TOOL_OUTCOMES), name="outcome"),
    CheckConstraint(check_in("consumer", CONSUMERS), name="consumer"),
    CheckConstraint(
        "consumer <> 'mission' OR "
        "(iteration_id IS NOT NULL AND mission_id IS NOT NULL AND round IS NOT NULL)",
        name="mission_call",
    ),
    # The rate limit counts a user's recent calls of one tool across replicas.
    Index("ix_tool_invocations_user_id_tool_created_at", "user_id", "tool", "created_at"),
    Index("ix_tool_invocations_iteration_id", "iteration_id"),
)

# Bearer tokens of MCP clients (`mana-ai mcp token create USER`): only the SHA-256 of each
# token is stored; a revoked token stays (revoked_at) so old calls still name it.
agent_mcp_servers = Table(
    "agent_mcp_servers",
    metadata,
    Column(
        "agent_id",
        BigInteger,
        ForeignKey("agents.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("name", Text, primary_key=True),
    Column("transport", Text, nullable=False),
    Column("url", Text, nullable=True, comment="the endpoint of an http server"),
    Column("command", Text, nullable=True, comment="the program of a stdio server"),
    Column("args", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column(
        "headers",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="HTTP headers sent to the server (secrets: never logged nor printed)",
    ),
    Column(
        "env",
        JSONB,
        nullable=False,
        server_default=text("'{}'::jsonb"),
        comment="environment of a stdio server (secrets: never logged nor printed)",
    ),
    Column("required", Boolean, nullable=False, server_default=text("false")),
    timestamp("created_at", default_now=True),
    CheckConstraint(check_in("transport", MCP_TRANSPORTS), name="transport"),
    CheckConstraint(
        "(transport = 'http' AND url IS NOT NULL AND command IS NULL) OR "
        "(transport = 'stdio' AND command IS NOT NULL AND url IS NULL)",
        name="target",
    ),
)

notes = Table(
    "notes",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("title", Text, nullable=False),
    Column("body", Text, nullable=False, server_default=text("''")),
    timestamp("created_at", default_now=True),
    timestamp("updated_at", default_now=True),
    Column(
        "idempotency_key",
        Text,
        nullable=True,
        comment="the notes_create call that made it: at most one note per call",
    ),
    Index("ix_notes_user_id_updated_at", "user_id", "updated_at"),
    Index(
        "uq_notes_user_id_idempotency_key",
        "user_id",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

compacted_turns = Table(
    "compacted_turns",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "iteration_id",
        BigInteger,
        ForeignKey("mission_iterations.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("mission_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("compaction_index", Integer, nullable=False),
    Column("round", Integer, nullable=False, comment="the round it ran before"),
    Column(
        "start_index",
        Integer,
        nullable=False,
        comment="position in the log of the summary message that replaced the turns",
    ),
    Column("folded", JSONB, nullable=False, comment="the messages, verbatim"),
    Column("folded_turns", Integer, nullable=False),
    Column("summary", Text, nullable=False),
    Column("tokens_before", Integer, nullable=False),
    Column("tokens_after", Integer, nullable=False),
    Column("model", Text, nullable=True),
    Column("duration_ms", Double, nullable=False, server_default=text("0")),
    Column(
        "error",
        Text,
        nullable=True,
        comment="NULL: it happened; else why the summariser's attempt changed nothing",
    ),
    timestamp("created_at", default_now=True),
    UniqueConstraint("iteration_id", "compaction_index"),
)
