"""Durable iterations: journaled write calls, idempotent notes, the attempts of a run.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

* ``tool_invocations.position`` (a call's place in its assistant message) and
  ``idempotency_key``; outcomes ``started`` (a write or destructive call recorded before its
  handler runs) and ``unknown`` (its worker stopped before the outcome was recorded).
* ``notes.idempotency_key``: ``notes_create`` makes at most one note per call.
* ``mission_iterations.attempts``: who ran each attempt, and where a takeover resumed.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_OUTCOMES = "outcome IN ('ok', 'error', 'denied')"
NEW_OUTCOMES = "outcome IN ('ok', 'error', 'denied', 'started', 'unknown')"


def upgrade() -> None:
    op.add_column(
        "tool_invocations",
        sa.Column(
            "position",
            sa.Integer(),
            nullable=False,
            server_default=sa.text("0"),
            comment="0-based position of the call in its assistant message",
        ),
    )
    op.add_column(
        "tool_invocations",
        sa.Column(
            "idempotency_key", sa.Text(), nullable=True, comment="write and destructive calls"
        ),
    )
    op.drop_constraint(op.f("ck_tool_invocations_outcome"), "tool_invocations", type_="check")
    op.create_check_constraint(
        op.f("ck_tool_invocations_outcome"), "tool_invocations", NEW_OUTCOMES
    )
    op.add_column(
        "notes",
        sa.Column(
            "idempotency_key",
            sa.Text(),
            nullable=True,
            comment="the notes_create call that made it: at most one note per call",
        ),
    )
    op.create_index(
        op.f("uq_notes_user_id_idempotency_key"),
        "notes",
        ["user_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.add_column(
        "mission_iterations",
        sa.Column(
            "attempts",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
            comment="each attempt: [{attempt, worker_id, started_at, resumed_after_round}]",
        ),
    )


def downgrade() -> None:
    op.drop_column("mission_iterations", "attempts")
    op.drop_index(op.f("uq_notes_user_id_idempotency_key"), table_name="notes")
    op.drop_column("notes", "idempotency_key")
    op.execute("DELETE FROM tool_invocations WHERE outcome IN ('started', 'unknown')")
    op.drop_constraint(op.f("ck_tool_invocations_outcome"), "tool_invocations", type_="check")
    op.create_check_constraint(
        op.f("ck_tool_invocations_outcome"), "tool_invocations", OLD_OUTCOMES
    )
    op.drop_column("tool_invocations", "idempotency_key")
    op.drop_column("tool_invocations", "position")
