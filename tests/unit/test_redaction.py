"""Secrets masked in every form a text may carry them, and every secret an operator can
configure is known (``worker.redaction``, ``worker.settings.configured_secrets``)."""

from __future__ import annotations

import html
import json
import logging
from urllib.parse import quote, quote_plus

import pytest

from worker import redaction
from worker.logs import _Formatter
from worker.redaction import MASK, Redactor
from worker.settings import Settings, configured_secrets
from worker.store.agent_servers import McpServerConfig
from worker.store.rows import json_safe

TRICKY = 'p@ss w/"quote"\\é&<x>+%'
"""A secret whose forms all differ: JSON, percent and HTML escaping each change it."""


@pytest.mark.parametrize(
    "form",
    [
        TRICKY,
        json.dumps(TRICKY)[1:-1],
        json.dumps(TRICKY, ensure_ascii=False)[1:-1],
        quote(TRICKY, safe=""),
        quote_plus(TRICKY, safe=""),
        html.escape(TRICKY),
    ],
    ids=["as is", "json ascii", "json", "percent", "form", "html"],
)
def test_a_secret_is_masked_in_every_form_a_text_carries_it(form: str) -> None:
    masking = Redactor([TRICKY])
    assert masking.found(f"peer says {form}!")
    assert masking.text(f"peer says {form}!") == f"peer says {MASK}!"


def test_longest_secrets_first_nested_json_and_short_secrets_left_alone() -> None:
    masking = Redactor(["abcd", "abcdefgh", "xy", "   "])
    assert masking.text("abcdefgh abcd xy") == f"{MASK} {MASK} xy"
    assert masking.json({"k-abcd": ["abcdefgh", 1, None, {"n": "abcd"}]}) == {
        f"k-{MASK}": [MASK, 1, None, {"n": MASK}]
    }
    assert not Redactor([]) and Redactor([]).text("abcd") == "abcd"


def test_stored_text_goes_through_the_process_secrets() -> None:
    secret = "sk-stored-0123456789"
    redaction.add_secrets([secret])
    # a structure stored as it is and one that needs the walk (NUL) are masked alike
    assert json_safe({"error": f"bad key {secret}"}) == {"error": f"bad key {MASK}"}
    assert json_safe([{"t": f"{secret}\x00"}]) == [{"t": f"{MASK}\ufffd"}]
    assert json_safe(f"x {secret}") == f"x {MASK}"


def test_log_lines_never_carry_a_secret() -> None:
    secret = "sk-logged-0123456789"
    redaction.add_secrets([secret])
    record = logging.LogRecord("t", logging.ERROR, "f", 1, "refused: %s", (secret,), None)
    for fmt in ("json", "text"):
        line = _Formatter(fmt).format(record)
        assert secret not in line and MASK in line


def test_every_secret_an_operator_configures_is_known() -> None:
    settings = Settings(
        llm_base_url="https://user:llmpass@llm.example/v1?key=urlkey",
        llm_api_key="sk-primary-key",
        llm_fallback_base_url="https://fallback.example/v1",
        llm_fallback_api_key="sk-fallback-key",
        compact_base_url="https://compact.example/v1",
        compact_api_key="sk-compact-key",
        database_url="postgresql://mana:db%40pass@db.example/mana?password=qpass",
        approval_webhook_url="https://hooks.slack.com/services/T0001/B0002/abcdefghijklmnopqrstuvwx",
    )
    environ = {
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=otlp%20key,authorization=Bearer otlptoken",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-honeycomb-team=hcteam",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel:otelpass@collector.example",
    }
    found = configured_secrets(settings, environ)
    for secret in (
        "llmpass",
        "urlkey",
        "sk-primary-key",
        "sk-fallback-key",
        "sk-compact-key",
        "db@pass",
        "qpass",
        "abcdefghijklmnopqrstuvwx",
        "/services/T0001/B0002/abcdefghijklmnopqrstuvwx",
        "otlp key",
        "otlptoken",
        "hcteam",
        "otelpass",
    ):
        assert secret in found, secret
    server = McpServerConfig(
        name="gh",
        transport="http",
        url="https://mcp.example/mcp?token=qtoken",
        headers={"Authorization": "Bearer hdrtoken", "X-Key": "xkey-value"},
    )
    assert {"Bearer hdrtoken", "hdrtoken", "xkey-value", "qtoken"} <= server.secrets()
    stdio = McpServerConfig(name="fs", transport="stdio", command="x", env={"TOKEN": "envtok"})
    assert stdio.secrets() == {"envtok"}


def test_spans_leave_the_process_with_its_secrets_masked() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    from worker.tracing.masking import MaskingSpanExporter

    secret = "sk-spanned-0123456789"
    redaction.add_secrets([secret])
    caught = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(MaskingSpanExporter(caught)))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span(f"chat {secret}") as span:
        span.set_attribute("error.message", f"refused {secret}")
        span.set_attribute("list", [secret, "plain", 3])
        span.add_event("retry", {"why": json.dumps({"key": secret})})
        span.set_status(Status(StatusCode.ERROR, f"401 {secret}"))
    with tracer.start_as_current_span("clean") as span:
        span.set_attribute("n", 1)
    masked, clean = caught.get_finished_spans()
    text = repr((masked.name, dict(masked.attributes or {}), masked.events, masked.status))
    text += repr([dict(e.attributes or {}) for e in masked.events]) + str(masked.status.description)
    assert secret not in text and MASK in text
    assert clean.name == "clean" and dict(clean.attributes or {}) == {"n": 1}
    provider.shutdown()
