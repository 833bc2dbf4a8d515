"""The daemon's configuration, read once from ``MANA_AI_*`` environment variables by
pydantic-settings: ``load_settings()`` builds the ``Settings`` model (``worker.settings.model``,
one section per concept: ``database``, ``daemon``, ``run``, ``llm``, ``compaction``,
``policy``, ``api``, ``web``, ``mcp``, ``tracing``, ``logs``) and reports what is wrong with
them; ``unknown_variables()`` finds the ones that name no setting.

This package is the only one that reads the environment. The entry point calls
``load_settings()`` once and passes explicit, typed values down; nothing below it looks at
``os.environ``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from worker import redaction
from worker.database_url import redact_url
from worker.errors import SettingsError
from worker.http_url import redact_url as redact_http_url
from worker.settings.model import ENV_PREFIX, VARIABLES, Settings, Variable, variables
from worker.settings.secrets import OTLP_HEADER_VARIABLES, configured_secrets
from worker.settings.tracing import otel_variables

__all__ = [
    "ENV_PREFIX",
    "OTLP_HEADER_VARIABLES",
    "Settings",
    "Variable",
    "configured_secrets",
    "load_settings",
    "otel_variables",
    "unknown_variables",
    "variables",
]


def load_settings(**overrides: Any) -> Settings:
    """Read ``Settings`` from the environment (``MANA_AI_*``); ``overrides`` win over it, by
    variable name (``database_url=...``, ``tick_interval_s=...``) or by section
    (``database={...}``). From then on the secrets they hold (``configured_secrets``) are
    masked in every text the process stores, logs, exports or prints (``worker.redaction``).

    Raises:
        SettingsError: one line per invalid value, e.g.
            ``MANA_AI_TICK_INTERVAL_S: Input should be greater than 0 (got '-1')``.
            The API keys are never echoed, the database URL only without its password.
    """
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    redaction.add_secrets(configured_secrets(settings))
    return settings


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """``MANA_AI_*`` variables in ``environ`` (default: the process environment) that name no
    setting, each with a suggestion when one is close (``MANA_AI_DATABSE_URL (did you mean
    MANA_AI_DATABASE_URL?)``). ``MANA_AI_TEST_*`` variables belong to the test suite and are
    not reported. The entry point warns about them: a typo would otherwise silently fall back
    to a default (e.g. the embedded database)."""
    env = os.environ if environ is None else environ
    known = [ENV_PREFIX + name for name in VARIABLES]
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


def _describe(exc: ValidationError) -> str:
    """One line per error of ``exc``: the variable, the message, the value as given (an API
    key never, a URL without its password and query values)."""
    names = {v.path: v.name for v in variables()}
    lines = []
    for error in exc.errors(include_url=False):
        loc = tuple(str(part) for part in error["loc"])
        path = next((loc[:n] for n in range(len(loc), 0, -1) if loc[:n] in names), loc)
        name = names.get(path) or ENV_PREFIX + "_".join(path).upper() or "?"
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        if path[-1:] == ("api_key",):
            shown = "'***'"
        elif path == ("database", "url") and isinstance(value, str):
            shown = repr(redact_url(value))
        elif path[-1:] == ("base_url",) and isinstance(value, str):
            shown = repr(redact_http_url(value))
        else:
            shown = repr(value)
        lines.append(f"{name}: {message} (got {shown})")
    return "\n".join(lines)
