"""Exceptions the worker raises for the operator (never shown to the model).

Tree::

    ManaAIError                   root of every failure raised on purpose (planner.errors)
    ├── PlannerError              the planner's tree (planner.errors)
    ├── SettingsError             the environment holds an invalid MANA_AI_* value
    ├── DatabaseError             the database could not be reached, started or migrated
    ├── ScheduleError             a cron expression or timezone is invalid (worker.schedule)
    ├── UsageError                a request is wrong: a command line (exit 2), an API body (400)
    ├── ReplayError               a stored iteration cannot be read back (worker.admin.replay)
    ├── ToolSourceError           an MCP server cannot be used (worker.mcp.sources)
    ├── NotFoundError             an admin command named an agent / mission / iteration that
    │                             does not exist
    └── ConflictError             an admin command would clash with existing data

``ManaAIError`` is defined in ``planner.errors`` (the lowest layer: the planner does not import
the worker) and re-exported here, so the planner's ``PlannerError`` tree hangs below the same
root and ``except ManaAIError`` catches every failure raised on purpose. Tool failures are not
exceptions at this level either: a handler that raises becomes an error tool result that the
model reads.
"""

from __future__ import annotations

from planner.errors import ManaAIError

__all__ = [
    "ConflictError",
    "DatabaseError",
    "ManaAIError",
    "NotFoundError",
    "SettingsError",
    "UsageError",
]


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


class UsageError(ManaAIError):
    """A malformed or contradictory request: a command line (exit status 2) or an HTTP API
    request body (400). The message names the flag or field and what is wrong."""
