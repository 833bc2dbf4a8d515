"""MCP both ways: mcp_tokens, agent_mcp_servers, and MCP clients' calls in tool_invocations.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

``tool_invocations`` records the calls of every consumer of the tools: a mission's (iteration,
mission and round set, as before) and an MCP client's (``consumer = 'mcp'``: no iteration, the
token it came with). Existing rows are mission calls (the column's default).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "mcp_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column(
            "token_hash",
            sa.Text(),
            nullable=False,
            comment="hex SHA-256 of the token; the token itself is never stored",
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mcp_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_mcp_tokens_token_hash")),
    )
    op.create_index(op.f("ix_mcp_tokens_user_id"), "mcp_tokens", ["user_id"])

    op.create_table(
        "agent_mcp_servers",
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("transport", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=True, comment="the endpoint of an http server"),
        sa.Column("command", sa.Text(), nullable=True, comment="the program of a stdio server"),
        sa.Column(
            "args",
            postgresql.ARRAY(sa.Text()),
            nullable=False,
            server_default=sa.text("'{}'::text[]"),
        ),
        sa.Column(
            "headers",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'{}'::jsonb"),
            comment="HTTP headers sent to the server (secrets: never logged nor printed)",
        ),
        sa.Column(
            "env",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'{}'::jsonb"),
            comment="environment of a stdio server (secrets: never logged nor printed)",
        ),
        sa.Column("required", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_mcp_servers_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("agent_id", "name", name=op.f("pk_agent_mcp_servers")),
        sa.CheckConstraint(
            "transport IN ('http', 'stdio')", name=op.f("ck_agent_mcp_servers_transport")
        ),
        sa.CheckConstraint(
            "(transport = 'http' AND url IS NOT NULL AND command IS NULL) OR "
            "(transport = 'stdio' AND command IS NOT NULL AND url IS NULL)",
            name=op.f("ck_agent_mcp_servers_target"),
        ),
    )

    op.alter_column(
        "tool_invocations",
        "iteration_id",
        nullable=True,
        comment="NULL for a call of an MCP client",
        existing_type=sa.BigInteger(),
    )
    op.alter_column("tool_invocations", "mission_id", nullable=True, existing_type=sa.BigInteger())
    op.alter_column("tool_invocations", "round", nullable=True, existing_type=sa.Integer())
    op.add_column(
        "tool_invocations",
        sa.Column("consumer", sa.Text(), nullable=False, server_default=sa.text("'mission'")),
    )
    op.add_column(
        "tool_invocations",
        sa.Column(
            "mcp_token_id",
            sa.BigInteger(),
            nullable=True,
            comment="the token an MCP client called with (NULL: a mission, or mcp serve --stdio)",
        ),
    )
    op.create_foreign_key(
        op.f("fk_tool_invocations_mcp_token_id_mcp_tokens"),
        "tool_invocations",
        "mcp_tokens",
        ["mcp_token_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_check_constraint(
        op.f("ck_tool_invocations_consumer"),
        "tool_invocations",
        "consumer IN ('mission', 'mcp')",
    )
    op.create_check_constraint(
        op.f("ck_tool_invocations_mission_call"),
        "tool_invocations",
        "consumer <> 'mission' OR "
        "(iteration_id IS NOT NULL AND mission_id IS NOT NULL AND round IS NOT NULL)",
    )


def downgrade() -> None:
    # MCP clients' calls have no iteration: they cannot stay once the columns are NOT NULL.
    op.execute("DELETE FROM tool_invocations WHERE consumer <> 'mission'")
    op.drop_constraint(op.f("ck_tool_invocations_mission_call"), "tool_invocations", type_="check")
    op.drop_constraint(op.f("ck_tool_invocations_consumer"), "tool_invocations", type_="check")
    op.drop_constraint(
        op.f("fk_tool_invocations_mcp_token_id_mcp_tokens"), "tool_invocations", type_="foreignkey"
    )
    op.drop_column("tool_invocations", "mcp_token_id")
    op.drop_column("tool_invocations", "consumer")
    op.alter_column("tool_invocations", "round", nullable=False, existing_type=sa.Integer())
    op.alter_column("tool_invocations", "mission_id", nullable=False, existing_type=sa.BigInteger())
    op.alter_column(
        "tool_invocations",
        "iteration_id",
        nullable=False,
        comment=None,
        existing_comment="NULL for a call of an MCP client",
        existing_type=sa.BigInteger(),
    )
    op.drop_table("agent_mcp_servers")
    op.drop_index(op.f("ix_mcp_tokens_user_id"), table_name="mcp_tokens")
    op.drop_table("mcp_tokens")
