"""OtlpReceiver: a real OTLP/HTTP receiver that keeps what an OpenTelemetry exporter sends.

It listens on 127.0.0.1 with an OS-assigned port (``endpoint`` is what
``OTEL_EXPORTER_OTLP_ENDPOINT`` takes) and accepts ``POST /v1/traces`` and ``POST
/v1/metrics`` in the binary protobuf encoding (OTLP/HTTP, https://opentelemetry.io/docs/
specs/otlp/#otlphttp), gzip or not. Bodies are decoded with the official classes of
``opentelemetry-proto`` (``ExportTraceServiceRequest``, ``ExportMetricsServiceRequest``) and
answered 200 with an empty export response, as a collector does. ``spans()`` flattens what
arrived into ``ReceivedSpan`` values (attributes decoded to Python values, ids as hex) for
tests to check a span tree attribute by attribute; ``metric_points()`` does the same for
histogram data points.

``DeadCollector`` is the opposite: an OTLP endpoint that never answers, in the three ways a
collector can be down (``DEAD_MODES``), for tests that hold a stop or an exit to its bound.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = [
    "DEAD_MODES",
    "DeadCollector",
    "DeadMode",
    "OtlpReceiver",
    "ReceivedEvent",
    "ReceivedPoint",
    "ReceivedSpan",
]

SPAN_KINDS = {
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}
STATUS_CODES = {
    Status.STATUS_CODE_UNSET: "UNSET",
    Status.STATUS_CODE_OK: "OK",
    Status.STATUS_CODE_ERROR: "ERROR",
}


def value_of(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a Python value (arrays as tuples)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    if kind is None:
        return None
    return getattr(value, kind)


def attributes_of(pairs: Any) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids in hex (``parent_id`` ``""`` for a root), kind and status
    code as words, times in ns since the epoch."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    status: str
    status_message: str
    attributes: dict[str, Any]
    events: tuple[ReceivedEvent, ...]
    start_ns: int
    end_ns: int
    resource: dict[str, Any]
    scope: str
    schema_url: str


@dataclass(frozen=True)
class ReceivedPoint:
    """One histogram data point: its metric, attributes, count and sum, and the resource."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bounds: tuple[float, ...]
    schema_url: str


@dataclass
class _Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


class OtlpReceiver:
    """See the module docstring. Use as a context manager (``stop()`` at exit)."""

    def __init__(self) -> None:
        self._store = _Store()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self._store))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def paths(self) -> list[str]:
        """The paths of the requests received, in order."""
        with self._store.lock:
            return list(self._store.paths)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order they arrived."""
        with self._store.lock:
            requests = list(self._store.traces)
        return [span for request in requests for span in _spans(request)]

    def metric_points(self) -> list[ReceivedPoint]:
        """Every histogram data point received so far."""
        with self._store.lock:
            requests = list(self._store.metrics)
        return [point for request in requests for point in _points(request)]


DeadMode = Literal["black_hole", "dropping", "refused"]
DEAD_MODES: tuple[DeadMode, ...] = ("black_hole", "dropping", "refused")


class DeadCollector:
    """An OTLP/HTTP endpoint on 127.0.0.1 that never answers (``endpoint`` is what
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes), in one of three ways:

    * ``black_hole``: accepts every connection, then reads nothing, answers nothing and
      closes nothing (a collector that hangs, or a proxy in front of a dead one): a request
      waits for its timeout; ``accepted`` counts the connections;
    * ``dropping``: its listen backlog (0) is kept full by a connection of its own that it
      never accepts, so the kernel drops every SYN: a connect waits for its timeout, as with a
      host that drops packets;
    * ``refused``: the port is bound but not listening: every connect is refused at once
      (a port nobody listens on, which no other test can take meanwhile).

    Use as a context manager (``stop()`` at exit closes every socket).
    """

    def __init__(self, mode: DeadMode) -> None:
        self.mode = mode
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._closed = threading.Event()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None
        if mode == "black_hole":
            self._socket.listen(64)
            self._socket.settimeout(0.1)
            self._thread = threading.Thread(target=self._accept, name="dead-collector", daemon=True)
            self._thread.start()
        elif mode == "dropping":
            self._socket.listen(0)
            filler = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            self._held.append(filler)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by stop()
                return
            self._held.append(connection)
            self.accepted += 1

    def stop(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5)
        for held in self._held:
            held.close()
        self._socket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _spans(request: ExportTraceServiceRequest) -> Iterator[ReceivedSpan]:
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield ReceivedSpan(
                    name=span.name,
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(),
                    kind=SPAN_KINDS.get(span.kind, str(span.kind)),
                    status=STATUS_CODES.get(span.status.code, str(span.status.code)),
                    status_message=span.status.message,
                    attributes=attributes_of(span.attributes),
                    events=tuple(
                        ReceivedEvent(e.name, attributes_of(e.attributes)) for e in span.events
                    ),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    resource=resource,
                    scope=scope_spans.scope.name,
                    schema_url=scope_spans.schema_url,
                )


def _points(request: ExportMetricsServiceRequest) -> Iterator[ReceivedPoint]:
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.WhichOneof("data") != "histogram":
                    continue
                for point in metric.histogram.data_points:
                    yield ReceivedPoint(
                        metric=metric.name,
                        unit=metric.unit,
                        attributes=attributes_of(point.attributes),
                        count=point.count,
                        sum=point.sum,
                        bounds=tuple(point.explicit_bounds),
                        schema_url=scope_metrics.schema_url,
                    )


def _handler(store: _Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            path = self.path.split("?", 1)[0]
            answer: Any
            if path == "/v1/traces":
                request: Any = ExportTraceServiceRequest.FromString(body)
                answer = ExportTraceServiceResponse()
            elif path == "/v1/metrics":
                request = ExportMetricsServiceRequest.FromString(body)
                answer = ExportMetricsServiceResponse()
            else:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with store.lock:
                store.paths.append(path)
                target = store.traces if path == "/v1/traces" else store.metrics
                target.append(request)
            payload = answer.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler
