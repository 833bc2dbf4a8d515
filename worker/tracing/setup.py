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

**Bounds.** Export never holds a tick, a run or a stop: spans are handed to the
``BatchSpanProcessor``'s queue (2,048 spans, ``OTEL_BSP_MAX_QUEUE_SIZE``; more are dropped)
and the metrics to the reader, whose threads export them. One export waits for the collector
``OTEL_EXPORTER_OTLP_TIMEOUT`` at most, retries and their backoff included (the SDK reads it
in **seconds**, default 10, though the OpenTelemetry specification says milliseconds), in
those threads only. Nothing waits for them but the stop: ``Tracing.shutdown`` gives the last
spans and metrics ``SHUTDOWN_S`` (0.3 s) in all to go out, and then drops them. The SDK's own
exit hooks (``atexit``: a provider's shutdown, which joins its export threads and, for the
meter provider, exports one last time with the exporter's whole timeout) are not
registered, so the interpreter's exit waits for nothing of tracing either.

The providers are the app's own, not OpenTelemetry's global ones (two apps in one process,
as in tests, do not share them); the parent of a run's spans is whatever span is current
when the run starts, and a run's span is current while it runs, so spans of other
instrumentation in the process nest under it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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

CONTENT_CHARS = 16_384
"""Characters an attribute keeps at most when ``MANA_AI_OTEL_CAPTURE_CONTENT`` is on and no
``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` / ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` says
otherwise: a chat span's prompt is the whole conversation, and uncut, one batch of spans
passes the exporter's 64 MiB request limit and is dropped whole (spans of other missions
with it)."""

SHUTDOWN_S = 0.3
"""Seconds a stopping worker or command waits in all for its last spans and metrics to go
out (both at once). A collector beside the workers takes 10-15 ms (measured: `tick --once`
with a local one), and one that does not answer cannot hold a stop longer than this (module
docstring: **Bounds**); one far away may miss the last spans of a short command that opens
its first connection then (a TLS handshake across a continent): run an agent or collector
near the workers."""

_LIMIT_VARIABLES = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
_ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)

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
    text_limit: int = CONTENT_CHARS
    _tracer_provider: Any = None
    _meter_provider: Any = None

    def clipped(self, text: str) -> str:
        """``text`` cut to ``text_limit`` characters (span status messages, which the SDK's
        attribute limit does not cut)."""
        return text if len(text) <= self.text_limit else text[: self.text_limit] + "…"

    def shutdown(self, timeout_s: float = SHUTDOWN_S) -> bool:
        """Export what is still buffered and stop the exporters, waiting ``timeout_s`` seconds
        at most in all (default ``SHUTDOWN_S``): the tracer and the meter provider stop side by
        side, each in a daemon thread of its own, so a collector that does not answer (the
        providers join their export threads, the meter provider exports once more) holds
        nothing past ``timeout_s``, the process's exit included. What is not out by then is
        dropped, and a warning says so. Blocks: call it off the event loop. True when
        everything went out in time."""
        deadline = time.monotonic() + timeout_s
        stopping = []
        if self._tracer_provider is not None:
            stopping.append(_stopping(self._tracer_provider.shutdown, "otel-shutdown-traces"))
        if self._meter_provider is not None:  # told the wait too: its thread ends with it
            meter_shutdown = functools.partial(
                self._meter_provider.shutdown, timeout_millis=timeout_s * 1000
            )
            stopping.append(_stopping(meter_shutdown, "otel-shutdown-metrics"))
        if all(done.wait(max(0.0, deadline - time.monotonic())) for done in stopping):
            return True
        logger.warning(
            "the trace collector did not take the last spans and metrics within %g s: they are "
            "dropped (the missions are stored; only their traces are incomplete)",
            timeout_s,
        )
        return False


def _stopping(shutdown: Callable[[], object], name: str) -> threading.Event:
    """``shutdown()`` (a provider's) started in daemon thread ``name``; the event is set once
    it returned or raised (a failure is logged)."""
    done = threading.Event()

    def stop() -> None:
        try:
            shutdown()
        except Exception:
            logger.warning("stopping OpenTelemetry (%s) failed", name, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=stop, name=name, daemon=True).start()
    return done


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
    try:  # (the pipeline imports the names; here: is [otel] installed at all?)
        import opentelemetry.exporter.otlp.proto.http
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise SettingsError(
            f"tracing (MANA_AI_OTEL=on, or an OTEL_EXPORTER_OTLP_*ENDPOINT set) needs the "
            f"OpenTelemetry SDK and its OTLP exporter ({exc.name} is missing): pip install "
            "'mana-ai[otel]', or set MANA_AI_OTEL=off"
        ) from None
    endpoints = _endpoints(environ)
    text_limit = _text_limit(environ)
    try:
        return _pipeline(
            worker_id=worker_id,
            capture_content=capture_content,
            environ=environ,
            traces_exporter=traces_exporter,
            metrics_exporter=metrics_exporter,
            endpoints=endpoints,
            text_limit=text_limit,
        )
    except (ValueError, TypeError) as exc:  # the SDK refused one of its own variables
        given = ", ".join(f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith("OTEL_"))
        raise SettingsError(
            f"the OpenTelemetry SDK refused its settings: {exc} (set: {given or 'none'})"
        ) from None


def _pipeline(
    *,
    worker_id: str,
    capture_content: bool,
    environ: Mapping[str, str],
    traces_exporter: str,
    metrics_exporter: str,
    endpoints: dict[str, str],
    text_limit: int | None,
) -> Tracing:
    conventions = conventions_for(environ)
    resource = _resource(worker_id)
    limit = text_limit if text_limit is not None else CONTENT_CHARS
    tracer_provider = _tracer_provider(resource, traces_exporter, text_limit)
    if metrics_exporter == "otlp" and "traces" in endpoints and "metrics" not in endpoints:
        # only a traces endpoint: the metrics would go to localhost:4318 and fail every minute
        metrics_exporter = "none (no OTLP endpoint for metrics)"
    meter_provider = _meter_provider(resource, metrics_exporter)
    schema_url = conventions.schema_url
    tracer = tracer_provider.get_tracer(
        INSTRUMENTATION_NAME, package_version(), schema_url=schema_url
    )
    where = endpoints.get("traces", "http://localhost:4318 (the SDK's default)")
    logger.info(
        "tracing on: OpenTelemetry GenAI conventions %s, spans to %s%s, metrics to %s%s",
        conventions.version,
        traces_exporter,
        f" at {where}" if traces_exporter == "otlp" else "",
        metrics_exporter,
        ", with prompts and tool payloads (MANA_AI_OTEL_CAPTURE_CONTENT, values cut at "
        f"{limit} characters)"
        if capture_content
        else "",
    )
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        logger.warning(
            "OTEL_SDK_DISABLED=true: the OpenTelemetry SDK exports nothing, MANA_AI_OTEL=on "
            "or not; unset one of them"
        )
    duration, usage = _histograms(meter_provider, schema_url)
    return Tracing(
        tracer=tracer,
        operation_duration=duration,
        token_usage=usage,
        conventions=conventions,
        capture_content=capture_content,
        text_limit=limit,
        _tracer_provider=tracer_provider,
        _meter_provider=meter_provider,
    )


def _resource(worker_id: str) -> Any:
    """mana-ai's resource attributes, then what OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME
    say over them."""
    from opentelemetry.sdk.resources import (
        SERVICE_INSTANCE_ID,
        SERVICE_NAME,
        SERVICE_VERSION,
        OTELResourceDetector,
        Resource,
    )

    return Resource.create(
        {
            SERVICE_NAME: "mana-ai",
            SERVICE_VERSION: package_version(),
            SERVICE_INSTANCE_ID: worker_id,
        }
    ).merge(OTELResourceDetector().detect())


def _tracer_provider(resource: Any, traces_exporter: str, text_limit: int | None) -> Any:
    """The tracer provider, exporting (masked) to ``traces_exporter``: otlp, console or none."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from worker.tracing.masking import MaskingSpanExporter

    limits = SpanLimits(max_span_attribute_length=CONTENT_CHARS) if text_limit is None else None
    # shutdown_on_exit=False: no atexit hook that waits for the collector (module docstring)
    provider = TracerProvider(resource=resource, span_limits=limits, shutdown_on_exit=False)
    exporter: Any = None
    if traces_exporter == "otlp":
        exporter = OTLPSpanExporter()
    elif traces_exporter == "console":
        exporter = ConsoleSpanExporter()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(MaskingSpanExporter(exporter)))
    return provider


def _meter_provider(resource: Any, metrics_exporter: str) -> Any:
    """The meter provider exporting to ``metrics_exporter`` (otlp or console), else ``None``."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    if metrics_exporter not in ("otlp", "console"):
        return None
    exporter = OTLPMetricExporter() if metrics_exporter == "otlp" else ConsoleMetricExporter()
    reader = PeriodicExportingMetricReader(exporter)
    return MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)


def _histograms(meter_provider: Any, schema_url: str | None) -> tuple[Any, Any]:
    """The GenAI client's duration and token-usage histograms, or ``(None, None)``."""
    if meter_provider is None:
        return None, None
    meter = meter_provider.get_meter(INSTRUMENTATION_NAME, package_version(), schema_url=schema_url)
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
    return duration, usage


def _endpoints(environ: Mapping[str, str]) -> dict[str, str]:
    """Where spans (``traces``) and metrics (``metrics``) go, by the OTLP variables set: the
    signal's own variable, else the general one with ``/v1/traces`` or ``/v1/metrics``
    added (as the SDK does). An endpoint that is not an http(s) URL with a host is a
    settings error here, rather than a failed export every few seconds.

    Raises:
        SettingsError: naming the variable and what it holds.
    """
    found: dict[str, str] = {}
    for variable in _ENDPOINT_VARIABLES:
        value = environ.get(variable, "").strip()
        if not value:
            continue
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(
                f"{variable}: expected an http(s) URL such as http://collector:4318, got {value!r}"
            )
        if variable == "OTEL_EXPORTER_OTLP_ENDPOINT":
            base = value.rstrip("/")
            found.setdefault("traces", f"{base}/v1/traces")
            found.setdefault("metrics", f"{base}/v1/metrics")
        else:
            found["traces" if "TRACES" in variable else "metrics"] = value
    return found


def _text_limit(environ: Mapping[str, str]) -> int | None:
    """The attribute length limit the variables set (``None``: neither is set).

    Raises:
        SettingsError: one is set to anything but a whole number >= 1.
    """
    for variable in _LIMIT_VARIABLES:
        value = environ.get(variable, "").strip()
        if not value:
            continue
        if not value.isascii() or not value.isdigit() or int(value) < 1:
            raise SettingsError(f"{variable}: expected a whole number >= 1, got {value!r}")
        return int(value)
    return None


def _exporter_choice(environ: Mapping[str, str], variable: str) -> str:
    value = environ.get(variable, "").strip().lower() or "otlp"
    if value not in _EXPORTERS:
        raise SettingsError(
            f"{variable}: mana-ai exports with one of {', '.join(_EXPORTERS)}, got {value!r}"
        )
    return value
