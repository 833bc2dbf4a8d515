"""Compaction archive: compacted_turns, and agents.compact_max_ctx.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

Each compaction of an iteration's context stores the turns it folded, verbatim, with where
they were (``start_index``: the summary message that replaced them sits there in the log) and
the summary the model read instead, so that ``mana-ai replay`` restores the whole
conversation. An attempt whose summary was unusable (or whose summariser failed) is stored
too, with its ``error`` and nothing folded, so a replay shows it and a rerun repeats it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "agents",
        sa.Column(
            "compact_max_ctx",
            sa.Integer(),
            nullable=True,
            comment="NULL: MANA_AI_COMPACT_MAX_CTX; 0: never compact",
        ),
    )
    op.create_check_constraint(
        op.f("ck_agents_compact_max_ctx"),
        "agents",
        "compact_max_ctx IS NULL OR compact_max_ctx >= 0",
    )
    op.create_table(
        "compacted_turns",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("iteration_id", sa.BigInteger(), nullable=False),
        sa.Column("mission_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("compaction_index", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False, comment="the round it ran before"),
        sa.Column(
            "start_index",
            sa.Integer(),
            nullable=False,
            comment="position in the log of the summary message that replaced the turns",
        ),
        sa.Column("folded", postgresql.JSONB(), nullable=False, comment="the messages, verbatim"),
        sa.Column("folded_turns", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Double(), nullable=False, server_default=sa.text("0")),
        sa.Column(
            "error",
            sa.Text(),
            nullable=True,
            comment="NULL: it happened; else why the summariser's attempt changed nothing",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compacted_turns")),
        sa.ForeignKeyConstraint(
            ["iteration_id"],
            ["mission_iterations.id"],
            name=op.f("fk_compacted_turns_iteration_id_mission_iterations"),
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "iteration_id",
            "compaction_index",
            name=op.f("uq_compacted_turns_iteration_id_compaction_index"),
        ),
    )


def downgrade() -> None:
    op.drop_table("compacted_turns")
    op.drop_constraint(op.f("ck_agents_compact_max_ctx"), "agents", type_="check")
    op.drop_column("agents", "compact_max_ctx")
