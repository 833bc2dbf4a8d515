"""The settings model: ``Settings``, a pydantic-settings ``BaseSettings`` with one section per
concept (``settings.database.url``, ``settings.llm.primary.base_url``), and ``VARIABLES``,
the environment variable of each of its fields.

Every variable keeps its flat name (``MANA_AI_DATABASE_URL``, ``MANA_AI_COMPACT_MAX_CTX``):
pydantic-settings reads a nested field only from a delimited name (``MANA_AI_DATABASE__URL``),
so ``FlatVariables``, the model's environment source, is pydantic-settings' own one (prefix
``MANA_AI_``, any case, an empty value unset, the text given as it is to the field's parser)
with the names of ``VARIABLES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from worker.settings.api import ApiSettings
from worker.settings.compaction import CompactionSettings
from worker.settings.daemon import DaemonSettings
from worker.settings.database import DatabaseSettings
from worker.settings.llm import ENDPOINTS, LlmSettings
from worker.settings.logs import LogSettings
from worker.settings.mcp import McpSettings
from worker.settings.policy import PolicySettings
from worker.settings.run import RunSettings
from worker.settings.tracing import TracingSettings
from worker.settings.values import ENV_PREFIX
from worker.settings.web import WebSettings

__all__ = ["ENV_PREFIX", "VARIABLES", "Settings", "Variable", "nested", "variables"]

VARIABLES: dict[str, tuple[str, ...]] = {
    "DATABASE_URL": ("database", "url"),
    "DATA_DIR": ("database", "data_dir"),
    "DB_POOL_SIZE": ("database", "pool_size"),
    "DB_MAX_OVERFLOW": ("database", "max_overflow"),
    "DB_STATEMENT_TIMEOUT_S": ("database", "statement_timeout_s"),
    "DB_PGBOUNCER": ("database", "pgbouncer_mode"),
    "DB_START_WAIT_S": ("database", "start_wait_s"),
    "WORKER_ID": ("daemon", "worker_id"),
    "TICK_INTERVAL_S": ("daemon", "tick_interval_s"),
    "MAX_CONCURRENT_MISSIONS": ("daemon", "max_concurrent_missions"),
    "LEASE_S": ("daemon", "lease_s"),
    "WAKE_UP": ("daemon", "wake_up"),
    "SHUTDOWN_GRACE_S": ("daemon", "shutdown_grace_s"),
    "METRICS_PORT": ("daemon", "metrics_port"),
    "METRICS_HOST": ("daemon", "metrics_host"),
    "CHECKPOINT_EVERY_ROUNDS": ("run", "checkpoint_every_rounds"),
    "MAX_PARALLEL_READS": ("run", "max_parallel_reads"),
    "TOOL_TIMEOUT_S": ("run", "tool_timeout_s"),
    "REMINDERS": ("run", "reminders"),
    "REMINDERS_DISABLED": ("run", "reminders_disabled"),
    "REMINDER_ROLE": ("run", "reminder_role"),
    **{
        prefix + name.upper(): ("llm", use, name)
        for use, (prefix, _) in ENDPOINTS.items()
        for name in ("base_url", "api_key", "model")
    },
    "LOCAL_RUNTIME": ("llm", "local_runtime"),
    "LLM_TIMEOUT_S": ("llm", "timeout_s"),
    "LLM_MAX_RETRIES": ("llm", "max_retries"),
    "LLM_MAX_RESPONSE_BYTES": ("llm", "max_response_bytes"),
    "LLM_SCHEMA_DIALECT": ("llm", "schema_dialect"),
    "LLM_SCHEMA_STRIP": ("llm", "schema_strip"),
    "COMPACT_MAX_CTX": ("compaction", "max_ctx"),
    "COMPACT_THRESHOLD": ("compaction", "threshold"),
    "COMPACT_MAX_PER_ITERATION": ("compaction", "max_per_iteration"),
    "COMPACT_MODEL_MAX_CTX": ("compaction", "model_max_ctx"),
    "POLICY_MODE": ("policy", "mode"),
    "POLICY_RATE_LIMIT": ("policy", "rate_limit"),
    "POLICY_RATE_WINDOW_S": ("policy", "rate_window_s"),
    "POLICY_TOOL_RATE_LIMITS": ("policy", "tool_rate_limits"),
    "POLICY_INJECTION_MARKERS": ("policy", "injection_markers"),
    "POLICY_MISSION_SCOPES": ("policy", "mission_scopes"),
    "POLICY_DESTRUCTIVE": ("policy", "destructive"),
    "APPROVAL_TTL_S": ("policy", "approval_ttl_s"),
    "APPROVAL_WEBHOOK_URL": ("policy", "approval_webhook_url"),
    "API_HOST": ("api", "host"),
    "API_PORT": ("api", "port"),
    "API_SESSION_TTL_S": ("api", "session_ttl_s"),
    "API_MAX_BODY_BYTES": ("api", "max_body_bytes"),
    "CONSOLE_URL": ("api", "console_url"),
    "WEB_ALLOW_PRIVATE": ("web", "allow_private"),
    "WEB_ALLOW_DOMAINS": ("web", "allow_domains"),
    "WEB_DENY_DOMAINS": ("web", "deny_domains"),
    "WEB_TIMEOUT_S": ("web", "timeout_s"),
    "WEB_MAX_BYTES": ("web", "max_bytes"),
    "WEB_MAX_CHARS": ("web", "max_chars"),
    "WEB_MAX_REDIRECTS": ("web", "max_redirects"),
    "MCP_HOST": ("mcp", "host"),
    "MCP_PORT": ("mcp", "port"),
    "MCP_SCOPES": ("mcp", "scopes"),
    "MCP_LIST_TIMEOUT_S": ("mcp", "list_timeout_s"),
    "MCP_MAX_RESULT_CHARS": ("mcp", "max_result_chars"),
    "OTEL": ("tracing", "otel"),
    "OTEL_CAPTURE_CONTENT": ("tracing", "capture_content"),
    "LOG_LEVEL": ("logs", "level"),
    "LOG_FORMAT": ("logs", "format"),
}
"""Each setting's variable (after ``MANA_AI_``) and the path of its field in ``Settings``:
``MANA_AI_DATABASE_URL`` sets ``settings.database.url``. ``load_settings(**overrides)`` takes
the same names in lower case (``database_url=...``)."""


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each key that names a variable (``VARIABLES``, any case, without
    ``MANA_AI_``) moved to its field's place: ``{"database_url": u}`` →
    ``{"database": {"url": u}}``. Other keys (sections, e.g. ``database={...}``) are kept; a
    flat key wins over the same field in a section given beside it."""
    found: dict[str, Any] = {k: v for k, v in values.items() if k.upper() not in VARIABLES}
    for key, value in values.items():
        path = VARIABLES.get(key.upper())
        if path is None:
            continue
        place = found
        for part in path[:-1]:
            inner = place.get(part)
            place[part] = inner = dict(inner) if isinstance(inner, Mapping | BaseModel) else {}
            place = inner
        place[path[-1]] = value
    return found


class FlatVariables(EnvSettingsSource):
    """pydantic-settings' environment source, reading each field of ``Settings`` from its
    variable in ``VARIABLES`` (``MANA_AI_DATABASE_URL`` → ``database.url``): any case (of two
    spellings the later one in the environment wins), an empty value unset, the text given to
    the field as it is (a list or a mapping is parsed by the field's own validator, never as
    JSON)."""

    def __call__(self) -> dict[str, Any]:
        """The nested values the environment sets."""
        found = {}
        for name in VARIABLES:
            value = self.env_vars.get((self.env_prefix + name).lower())
            if value is not None:
                found[name] = value
        return nested(found)


class Settings(BaseSettings):
    """Everything the daemon can be configured with, one section per concept; each field is
    read from its ``MANA_AI_*`` variable (``VARIABLES``). ``Settings(**values)`` takes sections
    (``database={"url": ...}``) or variables' names (``database_url=...``), winning over the
    environment.

    Build it with ``load_settings()``, which turns validation failures into a ``SettingsError``
    that names the offending variables.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        env_ignore_empty=True,  # MANA_AI_X= (common in compose files) means unset
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    def __init__(self, **values: Any) -> None:
        """``values`` (sections, or variables' names: ``nested``) over the environment.

        Raises:
            pydantic.ValidationError: a value fails its field's parsing or checks.
        """
        super().__init__(**nested(values))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The given values, then the environment (``FlatVariables``); no .env or secrets
        files."""
        return init_settings, FlatVariables(settings_cls)

    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings, description="PostgreSQL, its pool and the data dir."
    )
    daemon: DaemonSettings = Field(
        default_factory=DaemonSettings, description="The worker: tick, concurrency, leases."
    )
    run: RunSettings = Field(
        default_factory=RunSettings, description="A mission's run: tool calls, reminders."
    )
    llm: LlmSettings = Field(
        default_factory=LlmSettings, description="The LLM endpoints and their requests."
    )
    compaction: CompactionSettings = Field(
        default_factory=CompactionSettings, description="When a conversation is compacted."
    )
    policy: PolicySettings = Field(
        default_factory=PolicySettings, description="The policy gate and approvals."
    )
    api: ApiSettings = Field(
        default_factory=ApiSettings, description="`mana-ai serve`: the HTTP API and console."
    )
    web: WebSettings = Field(
        default_factory=WebSettings, description="The web_fetch tool's reach and limits."
    )
    mcp: McpSettings = Field(
        default_factory=McpSettings, description="`mana-ai mcp serve` and agents' MCP servers."
    )
    tracing: TracingSettings = Field(
        default_factory=TracingSettings, description="OpenTelemetry traces."
    )
    logs: LogSettings = Field(default_factory=LogSettings, description="Log level and format.")


@dataclass(frozen=True)
class Variable:
    """One setting's variable: its ``name`` (``MANA_AI_DATABASE_URL``), the ``path`` of its
    field in ``Settings`` (``("database", "url")``), the ``field`` (type, bounds, default) and
    its operator documentation (``description``, ``docs/reference/settings.md`` shows it)."""

    name: str
    path: tuple[str, ...]
    field: FieldInfo
    description: str


@cache
def variables() -> tuple[Variable, ...]:
    """Every setting's ``Variable``, in ``VARIABLES``' order."""
    found = []
    for name, path in VARIABLES.items():
        model: type[BaseModel] = Settings
        for part in path[:-1]:
            annotation = model.model_fields[part].annotation
            assert isinstance(annotation, type) and issubclass(annotation, BaseModel), path
            model = annotation
        field = model.model_fields[path[-1]]
        description = field.description or ""
        if path[0] == "llm" and path[1] in ENDPOINTS:
            description = ENDPOINTS[path[1]][1][path[2]]
        found.append(Variable(ENV_PREFIX + name, path, field, description))
    return tuple(found)
