"""mana-ai's alembic environment (``env.py``) and revisions (``versions/``).

A package so that ``worker.store.migrate`` finds the scripts from an installed wheel too.
"""

HEAD_REVISION = "0008"
"""The newest revision in ``versions/``: what a command that does not migrate checks the
database against, without loading alembic and every script (``worker.store.migrate``). A new
revision updates it; ``tests/unit/test_migrations_head.py`` fails until it does."""
