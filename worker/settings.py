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
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import ValidationError

from worker import redaction
from worker.db.urls import parse_url, redact_url
from worker.errors import SettingsError
from worker.http_url import redact_url as redact_http_url
from worker.settings_model import ENV_PREFIX, Settings

__all__ = [
    "ENV_PREFIX",
    "OTLP_HEADER_VARIABLES",
    "Settings",
    "configured_secrets",
    "load_settings",
    "otel_variables",
    "unknown_variables",
]


def load_settings(**overrides: Any) -> Settings:
    """Read ``Settings`` from the environment (``MANA_AI_*``); ``overrides`` win over it.
    From then on the secrets they hold (``configured_secrets``) are masked in every text the
    process stores, logs, exports or prints (``worker.redaction``).

    Raises:
        SettingsError: one line per invalid value, e.g.
            ``MANA_AI_TICK_INTERVAL_S: Input should be greater than 0 (got '-1')``.
            The API key is never echoed, the database URL only without its password.
    """
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    redaction.add_secrets(configured_secrets(settings))
    return settings


OTLP_HEADER_VARIABLES = (
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
)
"""The OpenTelemetry exporter's header variables (``key=value,key2=value2``): their values
(an ``Authorization`` header, a vendor's API key) are secrets."""

_OTLP_URL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)

_SECRET_SEGMENT_CHARS = 12
"""A path segment of a webhook URL this long or longer is taken for a token (Slack's
``/services/T…/B…/<24 characters>``, Discord's ``/api/webhooks/<id>/<token>``)."""


def configured_secrets(settings: Settings, environ: Mapping[str, str] | None = None) -> set[str]:
    """Every secret the operator configured, for ``worker.redaction``: the API keys of the
    three LLM endpoints, the credentials and query values of their URLs, the database
    password, the approval webhook's URL (whole, its path, its long path segments, its query
    values), and the values of the OTLP exporter's headers and the credentials of its
    endpoints (``environ``, default: the process environment). An agent's MCP server headers
    and environment values are added when a run opens that server."""
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for key in (settings.llm_api_key, settings.llm_fallback_api_key, settings.compact_api_key):
        if key is not None:
            found.add(key.get_secret_value())
    if settings.database_url:
        try:
            url = parse_url(settings.database_url)
        except ValueError:
            pass
        else:
            if url.password:
                found.add(url.password)
            for name in ("password",):
                value = url.query.get(name)
                found.update((value,) if isinstance(value, str) else value or ())
    for text in (
        settings.llm_base_url,
        settings.llm_fallback_base_url,
        settings.compact_base_url,
        *(env.get(name) for name in _OTLP_URL_VARIABLES),
    ):
        found.update(_url_credentials(text))
    webhook = settings.approval_webhook_url
    if webhook:
        found.add(webhook)
        found.update(_url_credentials(webhook))
        path = urlsplit(webhook).path
        found.add(path)
        found.update(p for p in path.split("/") if len(p) >= _SECRET_SEGMENT_CHARS)
    for name in OTLP_HEADER_VARIABLES:
        found.update(_header_values(env.get(name, "")))
    return {secret for secret in found if secret}


def _url_credentials(text: str | None) -> Iterator[str]:
    """The password and the query values of URL ``text``."""
    if not text:
        return
    try:
        parts = urlsplit(text)
        if parts.password:
            yield unquote(parts.password)
        for _, value in parse_qsl(parts.query, keep_blank_values=False):
            yield value
    except ValueError:
        return


def _header_values(text: str) -> Iterator[str]:
    """The values of an OTLP headers variable (``key=value,key2=value2``, values
    percent-encoded), each as given and decoded; a value of the form ``Bearer TOKEN`` gives
    its token too."""
    for item in text.split(","):
        _, sep, value = item.partition("=")
        if not sep:
            continue
        for form in (value.strip(), unquote(value.strip())):
            yield form
            scheme, _, token = form.partition(" ")
            if token.strip() and scheme.isalpha():
                yield token.strip()


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
