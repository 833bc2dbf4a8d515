"""``MaskingSpanExporter``: spans leave the process with its secrets masked.

What a run records is masked where it enters the run (``worker.redaction``), so a span's
content is clean already; this is the net for the rest: an exception message or a library's
text put on a span, an operator's system prompt that quotes a key. It wraps the exporter
(``worker.tracing.setup``), in the SDK's export thread: a batch with no secret in it is passed
on as it is, a span that holds one is copied with every string masked (name, attributes,
events, status description).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

from worker import redaction
from worker.redaction import Redactor

__all__ = ["MaskingSpanExporter"]


class MaskingSpanExporter(SpanExporter):
    """Exports through ``inner`` with the process's secrets masked in every span."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        masking = redaction.redactor()
        if masking:
            spans = [_masked(span, masking) for span in spans]
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _masked(span: ReadableSpan, masking: Redactor) -> ReadableSpan:
    texts = [span.name, span.status.description or ""]
    texts += _strings(span.attributes)
    for event in span.events:
        texts += [event.name, *_strings(event.attributes)]
    if not any(masking.found(text) for text in texts):
        return span
    status = span.status
    return ReadableSpan(
        name=masking.text(span.name),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_attributes(span.attributes, masking),
        events=[
            Event(
                masking.text(event.name),
                _attributes(event.attributes, masking),
                timestamp=event.timestamp,
            )
            for event in span.events
        ],
        links=span.links,
        kind=span.kind,
        status=Status(status.status_code, masking.text(status.description or "") or None),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _strings(attributes: Mapping[str, Any] | None) -> list[str]:
    found: list[str] = []
    for value in (attributes or {}).values():
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, Sequence) and not isinstance(value, bytes):
            found += [item for item in value if isinstance(item, str)]
    return found


def _attributes(attributes: Mapping[str, Any] | None, masking: Redactor) -> dict[str, Any]:
    masked: dict[str, Any] = {}
    for key, value in (attributes or {}).items():
        if isinstance(value, str):
            masked[key] = masking.text(value)
        elif isinstance(value, Sequence) and not isinstance(value, bytes):
            masked[key] = tuple(masking.text(v) if isinstance(v, str) else v for v in value)
        else:
            masked[key] = value
    return masked
