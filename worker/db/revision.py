"""The schema revision this mana-ai needs, and what a database at another one is told.

Known without alembic, SQLAlchemy or the migration scripts, so that a command which only
checks the revision (every command but ``db upgrade`` on a configured database) loads none
of them.
"""

from __future__ import annotations

__all__ = ["HEAD_REVISION", "REVISION_QUERY", "revision_problem"]

HEAD_REVISION = "0013"
"""The newest revision in ``migrations/versions``: what a command that does not migrate
checks the database against, without loading alembic and every script. A new revision
updates it; ``tests/unit/test_migrations_head.py`` fails until it does (it compares it with
``worker.db.migrate.head_revision()``, alembic's reading of the scripts)."""


REVISION_QUERY = "SELECT version_num FROM alembic_version"
"""The schema revision a database is at: the row of alembic's ``alembic_version`` table (what
alembic's ``MigrationContext.get_current_revision`` reads, for mana-ai's single line of
revisions); no row, or no such table (an error), means never migrated."""


def revision_problem(current: str | None) -> str | None:
    """Why a database at schema revision ``current`` (``None``: never migrated) cannot be
    used without migrating it, in one sentence that says what to do; ``None`` at
    ``HEAD_REVISION``. Revisions compare as text (``0001``, ``0002``, …)."""
    if current == HEAD_REVISION:
        return None
    if current is not None and current > HEAD_REVISION:
        return (
            f"the database schema is at revision {current}, newer than this "
            f"mana-ai knows ({HEAD_REVISION}): a newer mana-ai migrated it; run that one"
        )
    return (
        f"the database schema is at revision {current or '(none)'}, "
        f"this mana-ai needs {HEAD_REVISION}: run `mana-ai db upgrade` first"
    )
