"""Admin token names: two live tokens never share one.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

A token's name is who decides an approval through the HTTP API or the console, so two live
(not revoked) tokens must not share it. ``admin_tokens.name_key`` is the name as names are
compared: NFKC-normalised and case-folded (``Alice`` and ``ALICE`` are one name), computed in
Python (``worker.queries.admin_tokens.name_key``) for the rows there are; a unique index over it
for the live tokens enforces the rule. Live tokens that already share a key keep the newest
live and revoke the others (they are listed on stderr: `mana-ai admin token create` makes new
ones).
"""

import sys
import unicodedata
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key(name: str) -> str:
    # worker.queries.admin_tokens.name_key, frozen here: a migration never imports the app
    return unicodedata.normalize("NFKC", name).casefold()


def upgrade() -> None:
    op.add_column(
        "admin_tokens",
        sa.Column(
            "name_key",
            sa.Text(),
            nullable=True,
            comment="the name compared: NFKC, case-folded (Alice and ALICE are one name)",
        ),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.text("SELECT id, name, revoked_at IS NULL AS live FROM admin_tokens ORDER BY id DESC")
    ).all()
    kept: set[str] = set()
    for token_id, name, live in rows:
        key = _key(name)
        bind.execute(
            sa.text("UPDATE admin_tokens SET name_key = :key WHERE id = :id"),
            {"key": key, "id": token_id},
        )
        if not live:
            continue
        if key in kept:  # a newer live token has this name: this one is revoked
            bind.execute(
                sa.text("UPDATE admin_tokens SET revoked_at = now() WHERE id = :id"),
                {"id": token_id},
            )
            print(
                f"0011: admin token {token_id} ({name!r}) revoked: a newer live token has the "
                "same name",
                file=sys.stderr,
            )
        kept.add(key)
    op.alter_column("admin_tokens", "name_key", nullable=False)
    op.create_index(
        "uq_admin_tokens_live_name",
        "admin_tokens",
        ["name_key"],
        unique=True,
        postgresql_where=sa.text("revoked_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_admin_tokens_live_name", table_name="admin_tokens")
    op.drop_column("admin_tokens", "name_key")
