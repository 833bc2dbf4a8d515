"""An approval request says what its call would act on.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

``approval_requests.target`` holds the read-back a tool gives of a parked call's target for
the person who reviews it (``ToolSpec.describe``: ``note 8 "Q3 plan" (412 characters)``), as it
was when the gate asked; ``NULL`` for a tool that says nothing and for requests made before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "approval_requests",
        sa.Column(
            "target",
            sa.Text(),
            nullable=True,
            comment="what the call would act on, read back by its tool for the reviewer",
        ),
    )


def downgrade() -> None:
    op.drop_column("approval_requests", "target")
