"""The secrets the operator configured: ``configured_secrets(settings)``, which the process
masks in every text it stores, logs, exports or prints (``worker.redaction``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from worker.database_url import parse_url
from worker.settings.model import Settings

__all__ = ["OTLP_HEADER_VARIABLES", "configured_secrets"]

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
    endpoints = (settings.llm.primary, settings.llm.fallback, settings.llm.compaction)
    for endpoint in endpoints:
        if endpoint.api_key is not None:
            found.add(endpoint.api_key.get_secret_value())
    if settings.database.url:
        try:
            url = parse_url(settings.database.url)
        except ValueError:
            pass
        else:
            if url.password:
                found.add(url.password)
            for name in ("password",):
                value = url.query.get(name)
                found.update((value,) if isinstance(value, str) else value or ())
    for text in (
        *(endpoint.base_url for endpoint in endpoints),
        *(env.get(name) for name in _OTLP_URL_VARIABLES),
    ):
        found.update(_url_credentials(text))
    webhook = settings.policy.approval_webhook_url
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
