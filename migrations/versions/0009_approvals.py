"""Approvals: a destructive call parked until a person decides.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

* ``approval_requests``: one row per call the gate asked a person about (a mission's parked
  call, or an MCP client's refused one): the exact arguments and their hash, who asked, why,
  until when, and the decision (who, when, why). Never deleted.
* ``agents.destructive_policy``: ``deny`` or ``ask`` for this agent's destructive calls
  without opt-in (NULL: the daemon's ``MANA_AI_POLICY_DESTRUCTIVE``).
* ``mission_iterations.status`` gains ``awaiting_approval`` (a parked run, no lease held);
  ``tool_invocations.outcome`` gains ``parked`` (the call the run waits on).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_ITERATION_STATUSES = "status IN ('running', 'succeeded', 'failed')"
NEW_ITERATION_STATUSES = "status IN ('running', 'awaiting_approval', 'succeeded', 'failed')"
OLD_OUTCOMES = "outcome IN ('ok', 'error', 'denied', 'started', 'unknown')"
NEW_OUTCOMES = "outcome IN ('ok', 'error', 'denied', 'started', 'unknown', 'parked')"


def upgrade() -> None:
    op.create_table(
        "approval_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("consumer", sa.Text(), nullable=False, comment="mission or mcp"),
        sa.Column("status", sa.Text(), nullable=False, server_default=sa.text("'pending'")),
        sa.Column("user_id", sa.Text(), nullable=False, comment="whose space the call acts in"),
        sa.Column("agent_id", sa.BigInteger(), nullable=True),
        sa.Column("mission_id", sa.BigInteger(), nullable=True),
        sa.Column("iteration_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "attempt", sa.Integer(), nullable=True, comment="the attempt of the run that asked"
        ),
        sa.Column("round", sa.Integer(), nullable=True),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column(
            "arguments",
            postgresql.JSONB(),
            nullable=False,
            comment="exactly what the call would run with",
        ),
        sa.Column(
            "arguments_hash",
            sa.Text(),
            nullable=False,
            comment="hex SHA-256 of the arguments as canonical JSON (planner.approvals)",
        ),
        sa.Column(
            "reply_text", sa.Text(), nullable=True, comment="the model's text before the call"
        ),
        sa.Column("reason", sa.Text(), nullable=False, comment="why the gate asked"),
        sa.Column(
            "mcp_token_id",
            sa.BigInteger(),
            nullable=True,
            comment="the token of the MCP client that called (NULL: a mission, or stdio)",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "decision_note",
            sa.Text(),
            nullable=True,
            comment="the note of an approval, the reason of a denial or an expiry",
        ),
        sa.Column(
            "used_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="when the approved call of an MCP client ran on it (allowed once)",
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'denied', 'expired')",
            name=op.f("ck_approval_requests_status"),
        ),
        sa.CheckConstraint(
            "consumer IN ('mission', 'mcp')", name=op.f("ck_approval_requests_consumer")
        ),
        sa.CheckConstraint(
            "consumer <> 'mission' OR (mission_id IS NOT NULL AND iteration_id IS NOT NULL "
            "AND round IS NOT NULL AND position IS NOT NULL)",
            name=op.f("ck_approval_requests_mission_call"),
        ),
        sa.CheckConstraint(
            "(status = 'pending') = (decided_at IS NULL)",
            name=op.f("ck_approval_requests_decided_at"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approval_requests")),
    )
    op.create_index(
        op.f("uq_approval_requests_iteration_id_round_position"),
        "approval_requests",
        ["iteration_id", "round", "position"],
        unique=True,
        postgresql_where=sa.text("consumer = 'mission'"),
    )
    op.create_index(
        op.f("uq_approval_requests_user_id_tool_arguments_hash"),
        "approval_requests",
        ["user_id", "tool", "arguments_hash"],
        unique=True,
        postgresql_where=sa.text("consumer = 'mcp' AND status = 'pending'"),
    )
    op.create_index(
        op.f("ix_approval_requests_mission_id"),
        "approval_requests",
        ["mission_id"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        op.f("ix_approval_requests_status_created_at"),
        "approval_requests",
        ["status", "created_at"],
    )
    op.add_column(
        "agents",
        sa.Column(
            "destructive_policy",
            sa.Text(),
            nullable=True,
            comment="NULL: the daemon's MANA_AI_POLICY_DESTRUCTIVE; deny or ask",
        ),
    )
    op.create_check_constraint(
        op.f("ck_agents_destructive_policy"),
        "agents",
        "destructive_policy IS NULL OR destructive_policy IN ('deny', 'ask')",
    )
    op.drop_constraint(op.f("ck_mission_iterations_status"), "mission_iterations", type_="check")
    op.create_check_constraint(
        op.f("ck_mission_iterations_status"), "mission_iterations", NEW_ITERATION_STATUSES
    )
    op.drop_constraint(op.f("ck_tool_invocations_outcome"), "tool_invocations", type_="check")
    op.create_check_constraint(
        op.f("ck_tool_invocations_outcome"), "tool_invocations", NEW_OUTCOMES
    )


def downgrade() -> None:
    # a parked run cannot be represented before 0009: it becomes an interrupted one, which
    # the next claim resumes (and, without approvals, asks the gate again)
    op.execute(
        "UPDATE mission_iterations SET status = 'failed', stop_reason = 'interrupted' "
        "WHERE status = 'awaiting_approval'"
    )
    op.execute("UPDATE tool_invocations SET outcome = 'unknown' WHERE outcome = 'parked'")
    op.drop_constraint(op.f("ck_tool_invocations_outcome"), "tool_invocations", type_="check")
    op.create_check_constraint(
        op.f("ck_tool_invocations_outcome"), "tool_invocations", OLD_OUTCOMES
    )
    op.drop_constraint(op.f("ck_mission_iterations_status"), "mission_iterations", type_="check")
    op.create_check_constraint(
        op.f("ck_mission_iterations_status"), "mission_iterations", OLD_ITERATION_STATUSES
    )
    op.drop_constraint(op.f("ck_agents_destructive_policy"), "agents", type_="check")
    op.drop_column("agents", "destructive_policy")
    op.drop_table("approval_requests")
