"""The rate-limit ledger reserves a batch of calls in one set-based step.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``mana_ai_reserve_tool_calls(users[], tools[], consumers[], windows[], limits[])`` does for a
batch what ``mana_ai_reserve_tool_call`` (0002) does for one call, with the same rule and the
same advisory locks: it takes the transaction advisory lock of every (user, tool) of the batch
in the order of the lock keys (two batches never wait for each other in a cycle), prunes the
calls older than the window, counts each key's calls in the window, and reserves the batch's
calls of a key in their order while fewer than the limit are counted. One statement with a
few set-based queries instead of a function call and three queries per call: a burst of 500
reservations costs milliseconds, not the hundreds of milliseconds of 500 calls in a row on one
connection. The single-call function stays (``mana-ai mcp serve`` and older workers use it);
both take the same locks, so they share every limit exactly.

Per call it returns its 1-based position in the arrays (``ord``), whether a slot was taken,
the clock it counted at, and for a refused call the key's timestamps in the window (at most
its limit, newest first: the batch's reservations count, at that clock).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RESERVE_MANY_FUNCTION = r"""
CREATE OR REPLACE FUNCTION mana_ai_reserve_tool_calls(
    p_users text[], p_tools text[], p_consumers text[], p_windows interval[], p_limits integer[]
) RETURNS TABLE (ord bigint, reserved boolean, checked_at timestamptz, recent timestamptz[])
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(1835101793, k.h)
       FROM (SELECT DISTINCT hashtext(x.u || chr(31) || x.t) AS h
               FROM unnest(p_users, p_tools) AS x(u, t)
              ORDER BY 1) AS k;
    v_now := clock_timestamp();
    DELETE FROM policy_call_events AS e
     USING (SELECT x.u, x.t, max(x.w) AS w
              FROM unnest(p_users, p_tools, p_windows) AS x(u, t, w)
             GROUP BY x.u, x.t) AS k
     WHERE e.user_id = k.u AND e.tool = k.t AND e.created_at <= v_now - k.w;
    RETURN QUERY
    WITH req AS (
        SELECT r.u, r.t, r.c, r.w, r.lim, r.ord,
               row_number() OVER (PARTITION BY r.u, r.t ORDER BY r.ord) - 1 AS earlier
          FROM unnest(p_users, p_tools, p_consumers, p_windows, p_limits)
               WITH ORDINALITY AS r(u, t, c, w, lim, ord)
    ), decided AS (
        SELECT req.*,
               (SELECT count(*) FROM policy_call_events AS e
                 WHERE e.user_id = req.u AND e.tool = req.t
                   AND e.created_at > v_now - req.w) + req.earlier < req.lim AS ok
          FROM req
    ), taken AS (
        INSERT INTO policy_call_events (user_id, tool, consumer, created_at)
        SELECT d.u, d.t, d.c, v_now FROM decided AS d WHERE d.ok
        RETURNING 1
    )
    SELECT d.ord, d.ok, v_now,
           CASE WHEN d.ok THEN '{}'::timestamptz[] ELSE (
               SELECT coalesce(array_agg(w.ts ORDER BY w.ts DESC), '{}')
                 FROM (SELECT s.ts FROM (
                           SELECT v_now AS ts FROM decided AS d2
                            WHERE d2.u = d.u AND d2.t = d.t AND d2.ok
                           UNION ALL
                           SELECT e.created_at FROM policy_call_events AS e
                            WHERE e.user_id = d.u AND e.tool = d.t
                              AND e.created_at > v_now - d.w
                       ) AS s
                       ORDER BY s.ts DESC
                       LIMIT d.lim) AS w
           ) END
      FROM decided AS d
     ORDER BY d.ord;
END
$fn$;
"""


def upgrade() -> None:
    op.execute(RESERVE_MANY_FUNCTION)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION IF EXISTS "
        "mana_ai_reserve_tool_calls(text[], text[], text[], interval[], integer[])"
    )
