"""Exceptions the worker raises for the operator (never shown to the model).

Tree::

    ManaAIError                   root of every exception the worker raises on purpose
    ├── SettingsError             the environment holds an invalid MANA_AI_* value
    ├── DatabaseError             the database could not be reached, started or migrated
    ├── ScheduleError             a cron expression or timezone is invalid (worker.schedule)
    ├── NotFoundError             an admin command named an agent / mission / iteration that
    │                             does not exist
    └── ConflictError             an admin command would clash with existing data

Planner exceptions (``planner.errors.PlannerError``) are a separate tree: the planner does not
import the worker. Tool failures are not exceptions at this level either: a handler that raises
becomes an error tool result that the model reads.
"""

from __future__ import annotations

__all__ = ["ConflictError", "DatabaseError", "ManaAIError", "NotFoundError", "SettingsError"]


class ManaAIError(Exception):
    """Root of every exception the worker raises on purpose; the message is for the operator."""


class SettingsError(ManaAIError):
    """One or more ``MANA_AI_*`` environment variables hold invalid values.

    The message has one line per offending variable, naming it, saying what is wrong and
    showing the value that was given (secrets are masked).
    """


class DatabaseError(ManaAIError):
    """The database could not be reached, the embedded server could not start, or a migration
    failed. The message names the database (never its password) and what went wrong."""


class NotFoundError(ManaAIError):
    """An admin command named an agent, mission or iteration that does not exist."""


class ConflictError(ManaAIError):
    """An admin command would clash with existing data (a taken name, a completed mission)."""
