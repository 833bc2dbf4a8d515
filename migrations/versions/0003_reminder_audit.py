"""Reminder audit: mission_iterations.reminders.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

The reminders sent with each request of a run (round, producer, text), stored apart from the
message log, which never holds them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "mission_iterations",
        sa.Column(
            "reminders",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
            comment="reminders sent with each request: [{round, producer, text}]",
        ),
    )


def downgrade() -> None:
    op.drop_column("mission_iterations", "reminders")
