"""mana-ai's alembic environment (``env.py``) and revisions (``versions/``).

A package so that ``worker.db.migrate`` finds the scripts from an installed wheel too.
"""
