"""Missed runs: a catch-up policy per mission.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

``missions.catch_up`` says what a run does that is due later than it should start (a worker
was down, the database was away): ``skip`` (not run; the schedule goes on from now), ``once``
(the runs missed collapse into one run now: what every mission did before this revision, and
the default), ``all`` (each missed run within ``catch_up_window`` runs, oldest first, one
after another, while the agent's daily token budget has room). The window is only read for
``all``; ``NULL`` there means the default (one day).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "missions",
        sa.Column(
            "catch_up",
            sa.Text(),
            nullable=False,
            server_default=sa.text("'once'"),
            comment="missed runs: skip | once | all (within catch_up_window)",
        ),
    )
    op.add_column(
        "missions",
        sa.Column(
            "catch_up_window",
            sa.Interval(),
            nullable=True,
            comment="catch_up all: how far back missed runs still run (NULL: one day)",
        ),
    )
    op.create_check_constraint(
        op.f("ck_missions_catch_up"), "missions", "catch_up IN ('skip', 'once', 'all')"
    )
    op.create_check_constraint(
        op.f("ck_missions_catch_up_window"),
        "missions",
        "catch_up_window IS NULL OR catch_up_window > interval '0'",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_missions_catch_up_window"), "missions", type_="check")
    op.drop_constraint(op.f("ck_missions_catch_up"), "missions", type_="check")
    op.drop_column("missions", "catch_up_window")
    op.drop_column("missions", "catch_up")
