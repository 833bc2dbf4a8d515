"""Policy gate: user_policy_settings, the rate-limit ledger, agents.policy_mode.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

``mana_ai_reserve_tool_call(user, tool, consumer, window, limit)`` counts a user's calls of a
tool in the rolling window and, when fewer than ``limit``, records one, under a transaction
advisory lock per (user, tool): the count and the reservation are one atomic step, so replicas
never both take the last slot. It is one statement for the caller (one round trip, no session
state: it works through PgBouncer in transaction mode). The rule it applies is the one of
``planner.policy.rate_limit_wait``; see ``worker/queries/user_policy.py``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# pg_advisory_xact_lock(int4, int4): the first key is the ASCII bytes "mana" as an int4, so
# these locks never meet the migration lock (a single bigint key) or other applications'.
RESERVE_FUNCTION = r"""
CREATE OR REPLACE FUNCTION mana_ai_reserve_tool_call(
    p_user_id text, p_tool text, p_consumer text, p_window interval, p_limit integer
) RETURNS TABLE (reserved boolean, checked_at timestamptz, recent timestamptz[])
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_now timestamptz;
    v_recent timestamptz[];
BEGIN
    PERFORM pg_advisory_xact_lock(1835101793, hashtext(p_user_id || chr(31) || p_tool));
    v_now := clock_timestamp();
    DELETE FROM policy_call_events AS e
     WHERE e.user_id = p_user_id AND e.tool = p_tool AND e.created_at <= v_now - p_window;
    SELECT coalesce(array_agg(w.created_at), '{}') INTO v_recent
      FROM (SELECT e.created_at FROM policy_call_events AS e
             WHERE e.user_id = p_user_id AND e.tool = p_tool
               AND e.created_at > v_now - p_window
             ORDER BY e.created_at DESC
             LIMIT p_limit) AS w;
    reserved := cardinality(v_recent) < p_limit;
    IF reserved THEN
        INSERT INTO policy_call_events (user_id, tool, consumer, created_at)
        VALUES (p_user_id, p_tool, p_consumer, v_now);
    END IF;
    checked_at := v_now;
    recent := v_recent;
    RETURN NEXT;
END
$fn$;
"""


def upgrade() -> None:
    op.add_column(
        "agents",
        sa.Column(
            "policy_mode",
            sa.Text(),
            nullable=True,
            comment="NULL: the daemon's MANA_AI_POLICY_MODE",
        ),
    )
    op.create_check_constraint(
        op.f("ck_agents_policy_mode"),
        "agents",
        "policy_mode IS NULL OR policy_mode IN ('off', 'log-only', 'enforce')",
    )

    op.create_table(
        "user_policy_settings",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column(
            "destructive_opt_ins",
            postgresql.ARRAY(sa.Text()),
            nullable=False,
            server_default=sa.text("'{}'::text[]"),
            comment="tool names or scopes whose destructive tools the user allows",
        ),
        sa.Column(
            "rate_limit", sa.Integer(), nullable=True, comment="NULL: the operator's default"
        ),
        sa.Column(
            "tool_rate_limits",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'{}'::jsonb"),
            comment="tool name -> calls per window, for this user",
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_user_policy_settings")),
        sa.CheckConstraint(
            "rate_limit IS NULL OR rate_limit >= 1",
            name=op.f("ck_user_policy_settings_rate_limit_positive"),
        ),
    )

    op.create_table(
        "policy_call_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_call_events")),
    )
    op.create_index(
        op.f("ix_policy_call_events_user_id_tool_created_at"),
        "policy_call_events",
        ["user_id", "tool", "created_at"],
    )
    op.execute(RESERVE_FUNCTION)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION IF EXISTS mana_ai_reserve_tool_call(text, text, text, interval, integer)"
    )
    op.drop_table("policy_call_events")
    op.drop_table("user_policy_settings")
    op.drop_constraint(op.f("ck_agents_policy_mode"), "agents", type_="check")
    op.drop_column("agents", "policy_mode")
