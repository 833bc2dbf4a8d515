"""Wake-ups: NOTIFY mana_ai_due when a mission becomes claimable now.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

A row trigger on ``missions``, after an INSERT or an UPDATE of ``status``, ``next_run_at``,
``lease_owner`` or ``lease_expires_at``, sends ``NOTIFY mana_ai_due`` when the new row is what
the claim takes: ``status = 'active'``, ``next_run_at`` at or before the clock and no live
lease. That covers ``missions add --due-now``, ``missions resume`` of a due mission, a lease
released by an interrupted run (another worker resumes it) and a run finished with its next run
already due; it leaves out the claim itself (it sets a live lease), lease renewal, and a run
finished with its next run in the future. ``clock_timestamp()`` rather than ``now()``: a row
written with the client's "now" later in a long transaction is due by the time it commits.

The payload is empty, always: PostgreSQL delivers one of identical notifications (same channel
and payload) raised in one transaction, so an INSERT of a thousand due missions wakes each
listener once. Workers ``LISTEN mana_ai_due`` (``worker/daemon/wakeup.py``); the tick stays the
safety net for notifications missed while no listener was connected.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here: worker/daemon/wakeup.py's WAKE_UP_CHANNEL must keep this name.
CHANNEL = "mana_ai_due"


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION mana_ai_notify_due() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        COMMENT ON FUNCTION mana_ai_notify_due() IS
        'Wakes the workers (LISTEN mana_ai_due) when a mission becomes claimable now'
        """
    )
    # The WHEN clause is the claim's own "due" condition; rows that fail it never call the
    # function, so the claim's UPDATE of a whole batch costs one comparison per row.
    op.execute(
        """
        CREATE TRIGGER missions_notify_due
        AFTER INSERT OR UPDATE OF status, next_run_at, lease_owner, lease_expires_at
        ON missions
        FOR EACH ROW
        WHEN (
            NEW.status = 'active'
            AND NEW.next_run_at <= clock_timestamp()
            AND (NEW.lease_expires_at IS NULL OR NEW.lease_expires_at < clock_timestamp())
        )
        EXECUTE FUNCTION mana_ai_notify_due()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER missions_notify_due ON missions")
    op.execute("DROP FUNCTION mana_ai_notify_due()")
