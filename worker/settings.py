"""The daemon's configuration, read once from ``MANA_AI_*`` environment variables:
``load_settings()`` builds the ``Settings`` model (``worker.settings_model``) from them and
reports what is wrong with them; ``unknown_variables()`` finds the ones that name no setting.

The settings modules are the only ones that read the environment. The entry point calls
``load_settings()`` once and passes explicit, typed values down; nothing below it looks at
``os.environ``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from worker.database_url import redact_url
from worker.errors import SettingsError
from worker.http_url import redact_url as redact_http_url
from worker.settings_model import ENV_PREFIX, Settings

__all__ = ["ENV_PREFIX", "Settings", "load_settings", "otel_variables", "unknown_variables"]


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


def otel_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables of ``environ`` (default: the process environment), for the
    tracing setup: the OpenTelemetry SDK reads the ones it knows itself (endpoints, headers,
    sampler, resource); mana-ai reads ``OTEL_SEMCONV_STABILITY_OPT_IN`` from this and
    ``MANA_AI_OTEL``'s default from ``OTLP_ENDPOINT_VARIABLES``."""
    env = os.environ if environ is None else environ
    return {key: value for key, value in env.items() if key.startswith("OTEL_")}


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
