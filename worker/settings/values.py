"""How particular setting values are read: the parsers and checks that the fields of the
settings sections are annotated with, ``Section`` (their common configuration), and the bounds
the fields are held to.

Every value comes in as text (pydantic-settings gives each variable's text as it is). A parser
is a pydantic ``BeforeValidator`` (the text to the field's type: a comma-separated list, an
on/off switch, ``tool=calls`` pairs); a check is an ``AfterValidator`` (of the typed value: a
name, an http(s) URL, the known reminder producers).
A failed one raises ``ValueError``, which ``load_settings()`` reports with the variable's name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, SecretStr

from worker.data_dir import default_data_dir
from worker.database_url import to_async_url
from worker.http_url import http_url_problem, normalize_domain
from worker.names import normalised_name

__all__ = [
    "DAY_S",
    "ENV_PREFIX",
    "GIB",
    "HOUR_S",
    "LOG_LEVELS",
    "MAX_CONTEXT_TOKENS",
    "MIB",
    "MIN_CONTEXT_TOKENS",
    "MIN_TICK_INTERVAL_S",
    "PGBOUNCER_DEFAULT_PORT",
    "ApiKey",
    "CaseInsensitive",
    "CommaList",
    "ContextTokens",
    "DataDir",
    "DatabaseUrl",
    "Domains",
    "EndpointUrl",
    "Keywords",
    "LogLevel",
    "ModelName",
    "Name",
    "OnOff",
    "PgBouncerMode",
    "ReminderProducers",
    "Section",
    "ToolRateLimits",
]

ENV_PREFIX = "MANA_AI_"
"""The prefix of every setting's variable (``MANA_AI_LEASE_S``)."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

MIN_TICK_INTERVAL_S = 0.1
"""Shortest tick interval: APScheduler 3 rounds intervals to whole microseconds and runs an
interval of 0 every second, and a tick is at least a database round trip anyway."""
HOUR_S = 3_600
DAY_S = 86_400
"""Upper bounds of durations: every numeric setting has one, so that no value reaches a
``timedelta``, a timer or the database that they cannot hold."""
MIB = 1024 * 1024
GIB = 1024 * MIB
MIN_CONTEXT_TOKENS = 256
"""A model context smaller than this leaves no room to compact (a quarter is kept verbatim)."""
MAX_CONTEXT_TOKENS = 100_000_000

PGBOUNCER_DEFAULT_PORT = 6432
"""PgBouncer's default listening port (pgbouncer.ini ``listen_port``): ``MANA_AI_DB_PGBOUNCER=auto``
assumes PgBouncer on it."""


# -- parsers: text to the field's type (BeforeValidator) -------------------------------------------


def empty_is_unset(value: Any) -> Any:
    """``MANA_AI_X=`` (set but empty, common in compose files) means "not set"."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


def default_if_empty(value: Any) -> Any:
    """``MANA_AI_DATA_DIR=`` would otherwise mean the current directory."""
    if isinstance(value, str) and not value.strip():
        return default_data_dir()
    return value


def comma_list(value: Any) -> Any:
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


def domain_list(value: Any) -> Any:
    """``a.org, b.com`` → ``("a.org", "b.com")``, normalised (lower case, IDNA)."""
    if isinstance(value, str):
        value = value.split(",")
    if isinstance(value, list | tuple):
        return tuple(normalize_domain(str(v)) for v in value if str(v).strip())
    return value


def keyword_list(value: Any) -> Any:
    """``additionalProperties, default`` → ``("additionalProperties", "default")``."""
    if isinstance(value, str):
        return tuple(k.strip() for k in value.split(",") if k.strip())
    return value


def tool_rate_limits(value: Any) -> Any:
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


def log_level(value: Any) -> Any:
    """One of ``LOG_LEVELS``, any case, in upper case."""
    if isinstance(value, str):
        upper = value.strip().upper()
        if upper not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return upper
    return value


def lower_word(value: Any) -> Any:
    """Words are case-insensitive (``Enforce``, ``JSON``, ``Gemini``)."""
    return value.strip().lower() if isinstance(value, str) else value


def on_off(value: Any) -> Any:
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


def pgbouncer_switch(value: Any) -> Any:
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


# -- checks of the typed value (AfterValidator) ----------------------------------------------------


def checked_name(value: str | None) -> str | None:
    """The one rule for names (``worker.names``): trimmed, 1-200 characters, no control
    or invisible characters (a newline in a worker id would split its log lines)."""
    return None if value is None else normalised_name(value)


def async_database_url(value: str | None) -> str | None:
    """The database URL in asyncpg's dialect (``worker.database_url.to_async_url``)."""
    return None if value is None else to_async_url(value)


def checked_base_url(value: str | None) -> str | None:
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


def context_tokens(value: int) -> int:
    """0 (off) or at least ``MIN_CONTEXT_TOKENS``."""
    if 0 < value < MIN_CONTEXT_TOKENS:
        raise ValueError(f"must be 0 (off) or at least {MIN_CONTEXT_TOKENS} tokens")
    return value


def expanded_path(value: Path) -> Path:
    """``~`` expanded."""
    return value.expanduser()


def known_producers(value: tuple[str, ...]) -> tuple[str, ...]:
    """Only the names of reminder producers (``reminders.PRODUCER_NAMES``)."""
    from reminders import PRODUCER_NAMES

    unknown = [name for name in value if name not in PRODUCER_NAMES]
    if unknown:
        raise ValueError(
            f"unknown reminder producer(s) {', '.join(unknown)}; known: {', '.join(PRODUCER_NAMES)}"
        )
    return value


# -- the field types -------------------------------------------------------------------------------
# Validators nest in the order listed (each wraps the ones before it), which decides the input
# a failed check reports: ``ReminderProducers``' check reports the parsed names, the others the
# text as given.

DatabaseUrl = Annotated[
    str | None, BeforeValidator(empty_is_unset), AfterValidator(async_database_url)
]
"""A PostgreSQL URL, normalised to ``postgresql+asyncpg://``; ``None`` when unset or empty."""
EndpointUrl = Annotated[
    str | None, BeforeValidator(empty_is_unset), AfterValidator(checked_base_url)
]
"""An http(s) base URL without its trailing ``/``; ``None`` when unset or empty."""
ModelName = Annotated[str | None, BeforeValidator(empty_is_unset), AfterValidator(checked_name)]
"""A model name (``checked_name``); ``None`` when unset or empty."""
ApiKey = Annotated[SecretStr | None, BeforeValidator(empty_is_unset)]
"""A secret; ``None`` when unset or empty."""
Name = Annotated[str, AfterValidator(checked_name)]
"""A name by ``worker.names``' rule."""
DataDir = Annotated[Path, BeforeValidator(default_if_empty), AfterValidator(expanded_path)]
"""A directory, ``~`` expanded; the default one when empty."""
ContextTokens = Annotated[int, AfterValidator(context_tokens)]
"""A model context in tokens, 0 for off."""
Domains = Annotated[tuple[str, ...], BeforeValidator(domain_list)]
"""Comma-separated domains, normalised."""
Keywords = Annotated[tuple[str, ...], BeforeValidator(keyword_list)]
"""Comma-separated JSON Schema keywords."""
CommaList = Annotated[tuple[str, ...], BeforeValidator(comma_list)]
"""Comma-separated items (or a JSON array), without repeats."""
ReminderProducers = Annotated[
    tuple[str, ...], AfterValidator(known_producers), BeforeValidator(comma_list)
]
"""Comma-separated names of reminder producers."""
ToolRateLimits = Annotated[dict[str, int], BeforeValidator(tool_rate_limits)]
"""``tool=calls`` pairs, separated by commas."""
LogLevel = Annotated[str, BeforeValidator(log_level)]
"""One of ``LOG_LEVELS``, any case."""
OnOff = Annotated[Literal["on", "off"], BeforeValidator(on_off)]
"""``on`` or ``off``, or a boolean spelling."""
PgBouncerMode = Annotated[Literal["auto"] | bool, BeforeValidator(pgbouncer_switch)]
"""``auto``, or a boolean spelling."""
CaseInsensitive = BeforeValidator(lower_word)
"""Metadata for ``Annotated[Literal[...], CaseInsensitive]``: the words in any case."""


class Section(BaseModel):
    """The common configuration of a settings section (``Settings.database``, ``.llm``, ...):
    frozen, no unknown fields, no ``inf``/``nan`` (``MANA_AI_TICK_INTERVAL_S=inf`` is a typo,
    not a setting), and defaults pass the same checks as given values (``~`` expanded)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True
    )
