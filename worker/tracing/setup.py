"""The worker's OpenTelemetry pipeline: a tracer and a meter with the SDK's OTLP/HTTP exporters.

``open_tracing(...)`` builds, for one app, the SDK's ``TracerProvider`` (spans batched by a
``BatchSpanProcessor`` and exported by ``OTLPSpanExporter``) and ``MeterProvider`` (the
``gen_ai.client.*`` histograms, exported every ``OTEL_METRIC_EXPORT_INTERVAL`` ms, default
60 s, by ``OTLPMetricExporter``). Export runs in the SDK's own threads, never on the event
loop. The SDK reads its standard variables itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default
``http://localhost:4318``) and its ``_TRACES_`` / ``_METRICS_`` forms, ``_HEADERS``,
``_TIMEOUT``, ``_COMPRESSION``, ``_CERTIFICATE``; ``OTEL_TRACES_SAMPLER`` and its argument;
``OTEL_BSP_*``; ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` and the other span limits;
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (they win over mana-ai's defaults:
``service.name=mana-ai``, ``service.version``, ``service.instance.id=<worker id>``);
``OTEL_SDK_DISABLED``. Read here: ``OTEL_SEMCONV_STABILITY_OPT_IN``
(``worker.tracing.conventions``), ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER``
(``otlp``, the default; ``console``, one JSON object per span on stdout; ``none``) and
``OTEL_EXPORTER_OTLP_PROTOCOL`` (only ``http/protobuf``, the default, is installed by
``[otel]``).

The providers are the app's own, not OpenTelemetry's global ones (two apps in one process,
as in tests, do not share them); the parent of a run's spans is whatever span is current
when the run starts, and a run's span is current while it runs, so spans of other
instrumentation in the process nest under it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import SettingsError
from worker.tracing.conventions import (
    CHAT_DURATION_BUCKETS_S,
    TOKEN_USAGE_BUCKETS,
    Conventions,
    conventions_for,
)
from worker.version import package_version

__all__ = ["INSTRUMENTATION_NAME", "Tracing", "open_tracing"]

logger = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "mana-ai"
"""The instrumentation scope of mana-ai's spans and metrics."""

_EXPORTERS = ("otlp", "console", "none")


@dataclass
class Tracing:
    """The tracer, the GenAI metric instruments and the options of one app's tracing.

    Attributes:
        tracer: makes the spans (``opentelemetry.trace.Tracer``).
        operation_duration: ``gen_ai.client.operation.duration``, a histogram in seconds
            (``None`` with ``OTEL_METRICS_EXPORTER=none``: nothing is measured).
        token_usage: ``gen_ai.client.token.usage``, a histogram in tokens (or ``None``).
        conventions: the GenAI conventions version the spans follow.
        capture_content: record prompts, replies and tool payloads
            (``MANA_AI_OTEL_CAPTURE_CONTENT``).
    """

    tracer: Any
    operation_duration: Any
    token_usage: Any
    conventions: Conventions
    capture_content: bool
    _tracer_provider: Any = None
    _meter_provider: Any = None

    def shutdown(self) -> None:
        """Export what is still buffered and stop the exporters (blocks up to the exporters'
        timeouts when the collector does not answer: call it off the event loop)."""
        for provider in (self._tracer_provider, self._meter_provider):
            if provider is not None:
                provider.shutdown()


def open_tracing(*, worker_id: str, capture_content: bool, environ: Mapping[str, str]) -> Tracing:
    """The OpenTelemetry pipeline (module docstring) for a worker named ``worker_id``;
    ``environ`` holds the ``OTEL_*`` variables (``worker.settings.otel_variables()``).

    Raises:
        SettingsError: the ``[otel]`` dependencies are not installed, or an ``OTEL_*``
            variable read here names an exporter or protocol that is not available.
    """
    traces_exporter = _exporter_choice(environ, "OTEL_TRACES_EXPORTER")
    metrics_exporter = _exporter_choice(environ, "OTEL_METRICS_EXPORTER")
    protocol = environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or "http/protobuf"
    if protocol != "http/protobuf":
        raise SettingsError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: mana-ai exports over http/protobuf only, got "
            f"{protocol!r} (a collector's OTLP/HTTP port is 4318)"
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import (
            SERVICE_INSTANCE_ID,
            SERVICE_NAME,
            SERVICE_VERSION,
            OTELResourceDetector,
            Resource,
        )
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise SettingsError(
            f"MANA_AI_OTEL=on needs the OpenTelemetry SDK and its OTLP exporter ({exc.name} is "
            "missing): pip install 'mana-ai[otel]'"
        ) from None

    conventions = conventions_for(environ)
    # mana-ai's defaults, then what OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME say over them
    resource = Resource.create(
        {
            SERVICE_NAME: "mana-ai",
            SERVICE_VERSION: package_version(),
            SERVICE_INSTANCE_ID: worker_id,
        }
    ).merge(OTELResourceDetector().detect())

    tracer_provider = TracerProvider(resource=resource)
    if traces_exporter == "otlp":
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif traces_exporter == "console":
        tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    meter_provider = None
    if metrics_exporter != "none":
        exporter = OTLPMetricExporter() if metrics_exporter == "otlp" else ConsoleMetricExporter()
        reader = PeriodicExportingMetricReader(exporter)
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])

    schema_url = conventions.schema_url
    tracer = tracer_provider.get_tracer(
        INSTRUMENTATION_NAME, package_version(), schema_url=schema_url
    )
    logger.info(
        "tracing on: OpenTelemetry GenAI conventions %s, spans to %s, metrics to %s%s",
        conventions.version,
        traces_exporter,
        metrics_exporter,
        ", with prompts and tool payloads (MANA_AI_OTEL_CAPTURE_CONTENT)"
        if capture_content
        else "",
    )
    duration = usage = None
    if meter_provider is not None:
        meter = meter_provider.get_meter(
            INSTRUMENTATION_NAME, package_version(), schema_url=schema_url
        )
        duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=CHAT_DURATION_BUCKETS_S,
        )
        usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS,
        )
    return Tracing(
        tracer=tracer,
        operation_duration=duration,
        token_usage=usage,
        conventions=conventions,
        capture_content=capture_content,
        _tracer_provider=tracer_provider,
        _meter_provider=meter_provider,
    )


def _exporter_choice(environ: Mapping[str, str], variable: str) -> str:
    value = environ.get(variable, "").strip().lower() or "otlp"
    if value not in _EXPORTERS:
        raise SettingsError(
            f"{variable}: mana-ai exports with one of {', '.join(_EXPORTERS)}, got {value!r}"
        )
    return value
