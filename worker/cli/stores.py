"""Opening the database for one command.

Every command that opens the database goes through here (``database``, ``read_only``,
``served_tools``, ``admin_store``, ``policy_store``), or calls ``announce_database`` right
before it opens it (``tick`` and ``worker``, whose setup opens it), so that each one says which
embedded database it uses.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    # imported when a command runs, so that `--help` stays quick
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from worker.mcp.consumer import ServedTools
    from worker.queries.approval_requests import ApprovalStore
    from worker.queries.mcp_tokens import McpStore
    from worker.queries.missions import AdminStore
    from worker.queries.user_policy import PolicyStore
    from worker.settings import Settings

__all__ = [
    "admin_store",
    "announce_database",
    "approval_store",
    "database",
    "policy_store",
    "read_only",
    "served_tools",
]

T = TypeVar("T")


def announce_database(settings: Settings) -> None:
    """With no ``MANA_AI_DATABASE_URL``, say on stderr which embedded database the command
    uses, in one line, so that a forgotten variable does not silently show an empty database.
    Call it right before the database is opened; stdout (``--json``) stays clean.

    Run with a default data directory other than the old default (``~/.local/share/mana-ai``:
    as root, or with ``$XDG_DATA_HOME`` elsewhere), it also points at an embedded database
    left there by an earlier version, should one exist.
    """
    if settings.database.url is not None:
        return
    pgdata = settings.database.data_dir / "pgdata"
    print(
        f"mana-ai: MANA_AI_DATABASE_URL is not set: using the embedded PostgreSQL in {pgdata}",
        file=sys.stderr,
    )
    from worker.data_dir import USER_DATA_DIR

    old = Path(USER_DATA_DIR).expanduser()
    if "data_dir" not in settings.database.model_fields_set and old != settings.database.data_dir:
        if (old / "pgdata" / "PG_VERSION").exists():
            print(
                f"mana-ai: note: an embedded database from an earlier version is in "
                f"{old / 'pgdata'}; set MANA_AI_DATA_DIR={old} to use it",
                file=sys.stderr,
            )


@asynccontextmanager
async def database(
    settings: Settings, *, migrate: bool | None = None, wait_s: float = 0.0
) -> AsyncIterator[AsyncEngine]:
    """The configured (or embedded) database, announced (``announce_database``) and opened
    (``worker.db.configured.open_database``, which ``migrate`` and ``wait_s`` are passed
    to: a command run by hand does not wait, one that serves waits
    ``MANA_AI_DB_START_WAIT_S``), disposed on exit.

    Raises:
        DatabaseError: the database is unreachable, or not migrated (see ``open_database``).
    """
    from worker.db.configured import open_database

    announce_database(settings)
    async with open_database(settings, migrate=migrate, wait_s=wait_s) as engine:
        yield engine


async def read_only(settings: Settings, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """What ``read`` (a read of ``worker.queries.reads``) returns on a connection of
    ``database``'s engine (the embedded database started and announced, the schema checked).

    Raises:
        DatabaseError: as ``database`` raises it (unreachable, not at the schema's head).
    """
    async with database(settings) as engine, engine.connect() as conn:
        return await read(conn)


async def database_answers(settings: Settings) -> bool:
    """Wait until the configured database answers (``worker.db.configured.wait_for_database``:
    a daemon started during an outage, or before its database, rides it out for up to
    ``MANA_AI_DB_START_WAIT_S``, a log line per attempt); False when SIGTERM / SIGINT came
    first (said on stderr: the daemon then ends with status 0, as a running one does).

    Raises:
        DatabaseError: still unreachable after the wait, or refused for good.
    """
    import asyncio
    import signal

    from worker.db.configured import wait_for_database

    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(wait_for_database(settings))
    stopped = False

    def stop() -> None:
        nonlocal stopped
        stopped = True
        waiting.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        await waiting
    except asyncio.CancelledError:
        if not stopped:
            raise
        print("mana-ai: stopped before the database answered", file=sys.stderr)
        return False
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return True


@asynccontextmanager
async def served_tools(settings: Settings) -> AsyncIterator[tuple[ServedTools, McpStore]]:
    """What ``mcp serve`` serves (``worker.daemon.app.open_served_tools``) on the database, which is
    announced once the policy settings are known to be valid.

    Raises:
        SettingsError: a policy setting names an unknown tool or scope (nothing is opened).
        ManaAIError: the database could not be opened (or is not migrated).
    """
    from worker.daemon.tools_setup import check_policy_settings, open_served_tools
    from worker.tools import builtin_tool_catalog

    check_policy_settings(settings, builtin_tool_catalog())  # exit 2 before the database
    announce_database(settings)
    async with open_served_tools(settings) as opened:
        yield opened


@asynccontextmanager
async def admin_store(settings: Settings) -> AsyncIterator[AdminStore]:
    """An ``AdminStore`` on the configured (or embedded) database, closed on exit."""
    from worker.queries.missions import AdminStore

    async with database(settings) as engine:
        yield AdminStore(engine)


@asynccontextmanager
async def policy_store(settings: Settings) -> AsyncIterator[PolicyStore]:
    """A ``PolicyStore`` on the configured (or embedded) database, closed on exit."""
    from worker.queries.user_policy import PolicyStore

    async with database(settings) as engine:
        yield PolicyStore(engine)


@asynccontextmanager
async def approval_store(settings: Settings) -> AsyncIterator[ApprovalStore]:
    """An ``ApprovalStore`` on the configured (or embedded) database, closed on exit."""
    from worker.queries.approval_requests import ApprovalStore

    async with database(settings) as engine:
        yield ApprovalStore(engine)
