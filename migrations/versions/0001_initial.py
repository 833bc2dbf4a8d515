"""Initial schema: agents, missions, mission_iterations, tool_invocations, notes.

Revision ID: 0001
Revises:
Create Date: 2025-11-29

Written by hand: a change to worker/db/tables.py needs the same change in a new revision, and
tests/integration/test_migrations.py checks that the two agree. Names follow the naming
convention in worker/db/tables.py (pk_, fk_, uq_, ck_, ix_).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False)


def _ts(name: str, *, nullable: bool = False, default_now: bool = False) -> sa.Column[object]:
    return sa.Column(
        name,
        sa.DateTime(timezone=True),
        nullable=nullable,
        server_default=sa.text("now()") if default_now else None,
    )


def upgrade() -> None:
    op.create_table(
        "agents",
        _id(),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("owner_user_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True, comment="NULL: the daemon's default model"),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("max_rounds", sa.Integer(), nullable=False, server_default=sa.text("5")),
        sa.Column(
            "max_tokens_per_day", sa.Integer(), nullable=True, comment="NULL: no daily token budget"
        ),
        sa.Column(
            "allowed_tools",
            postgresql.ARRAY(sa.Text()),
            nullable=True,
            comment="NULL: all built-in tools",
        ),
        _ts("created_at", default_now=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
        sa.UniqueConstraint("name", name=op.f("uq_agents_name")),
        sa.CheckConstraint("max_rounds >= 1", name=op.f("ck_agents_max_rounds_positive")),
    )

    op.create_table(
        "missions",
        _id(),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("objective", sa.Text(), nullable=False),
        sa.Column(
            "cron", sa.Text(), nullable=True, comment="5-field cron expression; NULL: one-shot"
        ),
        sa.Column("timezone", sa.Text(), nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("status", sa.Text(), nullable=False, server_default=sa.text("'active'")),
        _ts("next_run_at", nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        _ts("lease_expires_at", nullable=True),
        _ts("deadline", nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        _ts("created_at", default_now=True),
        _ts("updated_at", default_now=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_missions")),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_missions_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(
            "status IN ('active', 'paused', 'completed')", name=op.f("ck_missions_status")
        ),
    )
    op.create_index(
        op.f("ix_missions_due"),
        "missions",
        ["next_run_at"],
        postgresql_where=sa.text("status = 'active'"),
    )

    op.create_table(
        "mission_iterations",
        _id(),
        sa.Column("mission_id", sa.BigInteger(), nullable=False),
        _ts("scheduled_for"),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column(
            "messages",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
        sa.Column("rounds", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column(
            "completion_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")
        ),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        _ts("started_at", default_now=True),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mission_iterations")),
        sa.ForeignKeyConstraint(
            ["mission_id"],
            ["missions.id"],
            name=op.f("fk_mission_iterations_mission_id_missions"),
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "mission_id",
            "scheduled_for",
            name=op.f("uq_mission_iterations_mission_id_scheduled_for"),
        ),
        sa.CheckConstraint(
            "status IN ('running', 'succeeded', 'failed')",
            name=op.f("ck_mission_iterations_status"),
        ),
    )
    op.create_index(
        op.f("ix_mission_iterations_mission_id_started_at"),
        "mission_iterations",
        ["mission_id", "started_at"],
    )

    op.create_table(
        "tool_invocations",
        _id(),
        sa.Column("iteration_id", sa.BigInteger(), nullable=False),
        sa.Column("mission_id", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("arguments", postgresql.JSONB(), nullable=False),
        sa.Column("result", postgresql.JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("policy_decision", postgresql.JSONB(), nullable=True),
        sa.Column("policy_mode", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Double(), nullable=False, server_default=sa.text("0")),
        _ts("created_at", default_now=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_invocations")),
        sa.ForeignKeyConstraint(
            ["iteration_id"],
            ["mission_iterations.id"],
            name=op.f("fk_tool_invocations_iteration_id_mission_iterations"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(
            "outcome IN ('ok', 'error', 'denied')", name=op.f("ck_tool_invocations_outcome")
        ),
    )
    op.create_index(
        op.f("ix_tool_invocations_user_id_tool_created_at"),
        "tool_invocations",
        ["user_id", "tool", "created_at"],
    )
    op.create_index(
        op.f("ix_tool_invocations_iteration_id"),
        "tool_invocations",
        ["iteration_id"],
    )

    op.create_table(
        "notes",
        _id(),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False, server_default=sa.text("''")),
        _ts("created_at", default_now=True),
        _ts("updated_at", default_now=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notes")),
    )
    op.create_index(
        op.f("ix_notes_user_id_updated_at"),
        "notes",
        ["user_id", "updated_at"],
    )


def downgrade() -> None:
    op.drop_table("notes")
    op.drop_table("tool_invocations")
    op.drop_table("mission_iterations")
    op.drop_table("missions")
    op.drop_table("agents")
