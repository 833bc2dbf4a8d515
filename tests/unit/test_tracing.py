"""Tracing of a run on the in-memory store with the OpenTelemetry SDK's own in-memory exporter
and reader: the latest conventions (``OTEL_SEMCONV_STABILITY_OPT_IN``), the opt-in content
attributes, failures as span status, a tracer that breaks without breaking the run, and the
settings that turn it on. The span tree over real OTLP/HTTP is the integration tier's
(``tests/integration/test_traces.py``)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the [otel] extra")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from planner import ChatModel, ToolContext, ToolSpec
from planner.errors import LLMStatusError
from planner.testing import ScriptedChatModel, final_answer, tool_calls
from worker.daemon.worker import Worker
from worker.errors import SettingsError
from worker.run.runner import MissionRunner
from worker.settings import load_settings
from worker.store.memory import InMemoryMissionStore
from worker.tracing import conventions
from worker.tracing.chat_spans import TracedChatModel
from worker.tracing.run_spans import RunSpans, RunTracer
from worker.tracing.setup import Tracing, open_tracing

LEASE = timedelta(seconds=30)


class Traced:
    """A ``Tracing`` whose spans and metrics stay in memory."""

    def __init__(self, version: conventions.Conventions, *, capture_content: bool) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        meter = MeterProvider(metric_readers=[self.reader]).get_meter("test")
        self.tracing = Tracing(
            tracer=provider.get_tracer("test"),
            operation_duration=meter.create_histogram("gen_ai.client.operation.duration"),
            token_usage=meter.create_histogram("gen_ai.client.token.usage"),
            conventions=version,
            capture_content=capture_content,
        )

    def spans(self) -> dict[str, ReadableSpan]:
        return {s.name: s for s in self.exporter.get_finished_spans()}


async def echo(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"echo": args.get("text")}


ECHO = ToolSpec(
    "echo",
    "Echo.",
    {"type": "object", "properties": {"text": {"type": "string"}}},
    "read",
    echo,
)


async def run_mission(traced: Traced, llm: ChatModel, *, provider: str = "openai") -> list[str]:
    store = InMemoryMissionStore()
    agent_id = store.add_agent("echoer", model="m1")
    store.add_mission(agent_id, cron=None, objective="Say hi.")
    runner = MissionRunner(
        store=store,
        llm=TracedChatModel(llm, traced.tracing, provider=provider),
        tools_for=lambda m: [ECHO],
        worker_id="w1",
        lease=LEASE,
        tracing=RunTracer(traced.tracing, provider=provider),
    )
    worker = Worker(
        store=store, runner=runner, worker_id="w1", max_concurrent_missions=1, lease=LEASE
    )
    return await worker.run_once()


async def test_the_latest_conventions_name_the_provider_and_the_agent_span_internal() -> None:
    traced = Traced(conventions.LATEST, capture_content=False)
    llm = ScriptedChatModel([tool_calls(("echo", {"text": "hi"})), final_answer("hi")])
    assert await run_mission(traced, llm) == ["succeeded"]
    spans = traced.spans()
    agent = spans["invoke_agent echoer"]
    assert agent.kind is SpanKind.INTERNAL
    assert agent.attributes is not None and agent.attributes["gen_ai.provider.name"] == "openai"
    assert "gen_ai.system" not in agent.attributes
    chat = spans["chat m1"]
    assert chat.kind is SpanKind.CLIENT and chat.attributes is not None
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    for span in spans.values():
        assert "gen_ai.input.messages" not in (span.attributes or {})
        assert "gen_ai.tool.call.arguments" not in (span.attributes or {})


async def test_content_is_recorded_only_when_asked_in_the_conventions_shapes() -> None:
    traced = Traced(conventions.DEFAULT, capture_content=True)
    llm = ScriptedChatModel([tool_calls(("echo", {"text": "hi"})), final_answer("said hi")])
    assert await run_mission(traced, llm) == ["succeeded"]
    spans = traced.spans()
    tool = spans["execute_tool echo"].attributes or {}
    assert json.loads(str(tool["gen_ai.tool.call.arguments"])) == {"text": "hi"}
    assert json.loads(str(tool["gen_ai.tool.call.result"])) == {"echo": "hi"}
    chats = sorted(
        (s for s in traced.exporter.get_finished_spans() if s.name == "chat m1"),
        key=lambda s: s.start_time or 0,
    )
    sent = json.loads(str((chats[1].attributes or {})["gen_ai.input.messages"]))
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[1]["parts"] == [{"type": "text", "content": "Say hi."}]
    [call] = sent[2]["parts"]
    assert call["type"] == "tool_call" and call["name"] == "echo"
    assert call["arguments"] == {"text": "hi"}
    assert sent[3]["parts"] == [
        {"type": "tool_call_response", "id": call["id"], "response": '{"echo": "hi"}'}
    ]
    answered = json.loads(str((chats[1].attributes or {})["gen_ai.output.messages"]))
    assert answered == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "said hi"}],
            "finish_reason": "stop",
        }
    ]
    agent = spans["invoke_agent echoer"].attributes or {}
    assert json.loads(str(agent["gen_ai.output.messages"]))[0]["parts"][0]["content"] == "said hi"


class Refusing:
    """A model whose endpoint answers 429 for good."""

    async def complete(self, request: Any) -> Any:
        raise LLMStatusError("rate limited for good", status_code=429, body="")


async def test_a_failed_run_is_an_error_span_with_the_stop_reason_and_the_status() -> None:
    traced = Traced(conventions.DEFAULT, capture_content=False)
    assert await run_mission(traced, Refusing()) == ["failed"]
    spans = traced.spans()
    agent, chat = spans["invoke_agent echoer"], spans["chat m1"]
    assert agent.status.status_code is StatusCode.ERROR and agent.status.description is None
    assert (agent.attributes or {})["error.type"] == "llm_error"
    assert chat.status.status_code is StatusCode.ERROR
    assert (chat.attributes or {})["error.type"] == "429"
    data = traced.reader.get_metrics_data()
    assert data is not None
    [point] = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "gen_ai.client.operation.duration"
        for p in m.data.data_points
    ]
    assert dict(point.attributes or {})["error.type"] == "429"


async def test_a_tracer_that_breaks_leaves_the_run_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: RunSpans, event: Any) -> None:
        raise RuntimeError("tracing bug")

    monkeypatch.setattr(RunSpans, "_tool_span", broken)
    traced = Traced(conventions.DEFAULT, capture_content=False)
    llm = ScriptedChatModel([tool_calls(("echo", {"text": "hi"})), final_answer("hi")])
    with caplog.at_level(logging.ERROR):
        assert await run_mission(traced, llm) == ["succeeded"]
    assert "tracing this run failed" in caplog.text
    assert "invoke_agent echoer" in traced.spans()  # still ended


async def test_a_parked_call_and_the_decision_it_waited_for_are_events_of_the_run() -> None:
    from tests.unit.test_approval_runs import Setup

    traced = Traced(conventions.DEFAULT, capture_content=False)
    s = Setup()

    def run_events() -> list[tuple[str, dict[str, Any]]]:
        [*_, run] = [
            span
            for span in traced.exporter.get_finished_spans()
            if span.name == "invoke_agent cleaner"
        ]
        return [(e.name, dict(e.attributes or {})) for e in run.events]

    tracer = RunTracer(traced.tracing, provider="openai")
    assert await s.worker(tracing=tracer).run_once() == ["awaiting_approval"]
    [(name, asked)] = run_events()
    assert name == "mana_ai.approval_requested"
    assert asked == {
        "gen_ai.tool.name": "notes_delete",
        "mana_ai.round": 1,
        "mana_ai.tool.position": 1,
    }
    [request] = s.store.approvals
    s.store.decide(request["id"], "approved", by="alice", note="fine")
    assert await s.worker(tracing=tracer).run_once() == ["succeeded"]
    [(name, decided)] = run_events()
    assert name == "mana_ai.approval_decided"
    assert decided["mana_ai.approval.request_id"] == request["id"]
    assert decided["mana_ai.approval.status"] == "approved"
    assert "execute_tool notes_delete" in traced.spans()


@pytest.mark.parametrize(
    ("opt_in", "latest"),
    [
        (None, False),
        ("", False),
        ("http", False),
        ("gen_ai_latest_experimental", True),
        ("http, GEN_AI_LATEST_EXPERIMENTAL", True),
        ("gen_ai_latest", False),
    ],
)
def test_the_latest_conventions_are_an_opt_in(opt_in: str | None, latest: bool) -> None:
    environ = {} if opt_in is None else {"OTEL_SEMCONV_STABILITY_OPT_IN": opt_in}
    chosen = conventions.conventions_for(environ)
    assert (chosen is conventions.LATEST) is latest
    assert chosen.schema_url.endswith("1.40.0" if latest else "1.36.0")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf only"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "not a url"}, "OTEL_EXPORTER_OTLP_ENDPOINT: expected"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://c/x"}, "an http\\(s\\) URL"),
        ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "abc"}, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"),
        ({"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-5"}, "whole number >= 1"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE=0"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"}, "refused its settings"),
    ],
)
def test_what_cannot_export_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], message: str
) -> None:
    for name, value in environ.items():  # the SDK reads its own variables too
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=message):
        open_tracing(worker_id="w", capture_content=False, environ=environ)


def test_with_only_a_traces_endpoint_no_metrics_go_to_a_default_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}
    tracing = open_tracing(worker_id="w", capture_content=False, environ=environ)
    try:
        assert tracing.operation_duration is None and tracing.token_usage is None
    finally:
        assert tracing.shutdown(timeout_s=5)


def test_a_collector_that_never_answers_holds_the_exit_for_the_timeout_only() -> None:
    import threading
    import time

    release = threading.Event()
    called: list[tuple[str, dict[str, Any]]] = []

    class Stuck:
        def __init__(self, name: str) -> None:
            self.name = name

        def shutdown(self, **kwargs: Any) -> None:
            called.append((self.name, kwargs))
            release.wait(30)

    traced = Traced(conventions.DEFAULT, capture_content=False)
    traced.tracing._tracer_provider = Stuck("traces")
    traced.tracing._meter_provider = Stuck("metrics")
    started = time.monotonic()
    assert traced.tracing.shutdown(timeout_s=0.2) is False
    assert time.monotonic() - started < 5
    # side by side: the meter provider is stopped (and told the wait) while the tracer's
    # shutdown hangs, not left to an exit hook that would export with the exporter's timeout
    assert sorted(called) == [("metrics", {"timeout_millis": 200.0}), ("traces", {})]
    release.set()


def test_the_sdk_registers_no_exit_hook_that_could_wait_for_a_collector() -> None:
    import atexit

    registered: list[Any] = []
    real_register = atexit.register

    def register(function: Any, *args: Any, **kwargs: Any) -> Any:
        registered.append(function)
        return real_register(function, *args, **kwargs)

    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atexit, "register", register)
        import opentelemetry.sdk.metrics._internal as metrics_internal

        patch.setattr(metrics_internal, "register", register)  # imported by name there
        tracing = open_tracing(worker_id="w", capture_content=False, environ=environ)
    try:
        assert tracing.operation_duration is not None  # the meter provider was made
        assert registered == []
    finally:
        tracing.shutdown(timeout_s=0.1)


async def test_captured_content_is_cut_and_hostile_names_are_escaped() -> None:
    from opentelemetry.sdk.trace import SpanLimits

    traced = Traced(conventions.DEFAULT, capture_content=True)
    provider = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=100))
    provider.add_span_processor(SimpleSpanProcessor(traced.exporter))
    traced.tracing.tracer = provider.get_tracer("test")
    traced.tracing.text_limit = 100
    long = "x" * 5000
    llm = ScriptedChatModel(
        [
            tool_calls(("echo", {"text": long}), ("ghost\u202e\x1b[31m", {})),
            final_answer("done"),
        ]
    )
    assert await run_mission(traced, llm) == ["succeeded"]
    spans = traced.exporter.get_finished_spans()
    echo = next(s for s in spans if s.name == "execute_tool echo")
    assert len(str((echo.attributes or {})["gen_ai.tool.call.arguments"])) == 100
    ghost = next(s for s in spans if s.name == "execute_tool")
    name = str((ghost.attributes or {})["gen_ai.tool.name"])
    assert "\u202e" not in name and "\x1b" not in name and "\\u202e" in name
    assert len(ghost.status.description or "") <= 101


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "off"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "on"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "on"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, "off"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, "off"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "MANA_AI_OTEL": "off"}, "off"),
        ({"MANA_AI_OTEL": "on"}, "on"),
    ],
)
def test_tracing_is_on_where_an_otlp_endpoint_is_configured(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: str
) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "MANA_AI_OTEL",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert load_settings().tracing.otel == expected


@pytest.mark.parametrize(
    ("name", "capture", "exported"),
    [
        ("clock_now", False, "clock_now"),  # offered: named, captured or not
        ("clock_now", True, "clock_now"),
        ("clock_now_v2", False, "_OTHER"),  # not offered: content
        ("clock_now\u200b", False, "_OTHER"),
        ("x" * 3016, False, "_OTHER"),
        ("x" * 3016, True, "x" * 128 + "…"),  # captured: cut
        ("a\x1b[31m\u202e", True, "a\\u001b[31m\\u202e"),  # and escaped
        ("\u202e" * 100, True, "\\u202e" * 21 + "\\u…"),  # escapes count toward the cut
        ("工具_🛠️", True, "工具_🛠️"),
        ("", False, "_OTHER"),
    ],
)
def test_a_tool_name_is_exported_only_when_offered_or_captured_and_always_bounded(
    name: str, capture: bool, exported: str
) -> None:
    from worker.tracing.chosen import tool_name

    assert tool_name(name, {"clock_now", "notes_add"}, capture_content=capture) == exported
