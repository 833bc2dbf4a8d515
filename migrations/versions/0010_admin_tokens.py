"""The HTTP API and console: admin tokens and console sessions.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

* ``admin_tokens``: bearer tokens of `mana-ai serve` (`mana-ai admin token create NAME`),
  stored as their SHA-256 only; ``read_only`` tokens change nothing; a revoked one stays.
* ``admin_sessions``: a browser signed in to the console with a token; only the SHA-256 of the
  session id its cookie holds is stored; ended by sign-out, expiry, or its token's revocation.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column(
            "name",
            sa.Text(),
            nullable=False,
            comment="who holds it; kept with what it decides",
        ),
        sa.Column(
            "token_hash",
            sa.Text(),
            nullable=False,
            comment="hex SHA-256 of the token; the token itself is never stored",
        ),
        sa.Column("read_only", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_admin_tokens_token_hash")),
    )
    op.create_table(
        "admin_sessions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column(
            "session_hash",
            sa.Text(),
            nullable=False,
            comment="hex SHA-256 of the session id in the cookie",
        ),
        sa.Column("token_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["admin_tokens.id"],
            name=op.f("fk_admin_sessions_token_id_admin_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_sessions")),
        sa.UniqueConstraint("session_hash", name=op.f("uq_admin_sessions_session_hash")),
    )
    op.create_index(op.f("ix_admin_sessions_token_id"), "admin_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_admin_sessions_token_id"), table_name="admin_sessions")
    op.drop_table("admin_sessions")
    op.drop_table("admin_tokens")
