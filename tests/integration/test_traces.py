"""Traces of a real mission (the worker wired from settings as ``mana-ai worker`` wires it, real
PostgreSQL, the fake LLM servers over HTTP) exported by the OpenTelemetry SDK's OTLP/HTTP
exporter to a receiver that decodes them with the official ``opentelemetry-proto`` classes:
the span tree and its attributes, one by one, and the ``gen_ai.client.*`` metrics. And with
tracing off, no OpenTelemetry module is even loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.json_text import storable_text
from tests.fakes import FakeLLMServer, chat_completion_body
from tests.integration.worker_harness import add_mission, iterations
from worker.daemon.app import open_app
from worker.db.tables import agents
from worker.settings import load_settings

if TYPE_CHECKING:
    from tests.fakes.otlp_receiver import OtlpReceiver, ReceivedSpan

THINKING = "Let me look at the clock once more before I answer. " * 12  # ~160 tokens


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """An OTLP receiver, named by ``OTEL_EXPORTER_OTLP_ENDPOINT`` as an operator would."""
    pytest.importorskip("opentelemetry.sdk", reason="tracing needs the [otel] extra")
    from tests.fakes.otlp_receiver import OtlpReceiver

    with OtlpReceiver() as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"):
            monkeypatch.delenv(name, raising=False)
        yield otlp


async def run_traced_mission(
    db: AsyncEngine, database_url: str, primary: FakeLLMServer, fallback: FakeLLMServer
) -> dict[str, Any]:
    """A three-round mission of agent ``clock-agent`` (model ``agent-model``, a 1,000-token
    context): round 1 reads the clock twice (side by side) and deletes a note (a would-be
    denial in log-only), after one 500 that is retried; round 2 reads the clock again and
    fills the context, so a compaction folds round 1 before round 3, whose request the
    primary refuses (400) and the fallback answers. (A compaction folds a turn and keeps the
    last: two rounds before it, so three in all.)"""
    await add_mission(db, cron=None, agent="clock-agent", objective="What time is it?")
    async with db.begin() as conn:
        await conn.execute(
            update(agents).values(
                compact_max_ctx=1000,
                max_rounds=5,
                model="agent-model",
                allowed_tools=["clock_now", "notes_delete"],
            )
        )
    primary.enqueue(status=500, json={"error": {"message": "busy"}})
    primary.enqueue_completion(
        content=f"Round 1. {THINKING}",
        tool_calls=[
            ("clock_now", {}),
            ("clock_now", {"timezone": "Europe/Paris"}),
            ("notes_delete", {"id": 99}),
        ],
        prompt_tokens=200,
        completion_tokens=160,
        model="agent-model-2025",
    )
    primary.enqueue_completion(
        content=f"Round 2. {THINKING}",
        tool_calls=[("clock_now", {})],
        prompt_tokens=790,
        completion_tokens=160,
    )
    primary.enqueue_completion(content="Facts found: the clock was read once.")
    primary.enqueue(status=400, json={"error": {"message": "no such model"}})
    fallback.enqueue_completion(content="It is late.", prompt_tokens=300, completion_tokens=4)
    settings = load_settings(
        database_url=database_url,
        llm_base_url=primary.base_url,
        llm_fallback_base_url=fallback.base_url,
        llm_max_retries=1,
        worker_id="tracer-1",
        otel="on",
        policy_mode="log-only",
        reminders_disabled=("rounds_left",),
    )
    async with open_app(settings) as app:
        assert await app.worker.run_once() == ["succeeded"]
    # leaving the app flushed the exporters
    async with db.connect() as conn:
        agent_id = (await conn.execute(select(agents.c.id))).scalar_one()
    return {**(await iterations(db))[-1], "agent_id": agent_id}


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


async def test_a_mission_is_one_trace_of_genai_spans_attribute_by_attribute(
    db: AsyncEngine, database_url: str, receiver: OtlpReceiver
) -> None:
    with FakeLLMServer() as primary, FakeLLMServer() as fallback:
        it = await run_traced_mission(db, database_url, primary, fallback)
        port, fallback_port = primary.port, fallback.port
    spans = receiver.spans()

    # the tree: one trace, invoke_agent at its root, everything else under it
    agent = one(spans, "invoke_agent clock-agent")
    assert agent.parent_id == "" and {s.trace_id for s in spans} == {agent.trace_id}
    assert agent.kind == "CLIENT"  # v1.36.0, the default conventions
    assert agent.schema_url == "https://opentelemetry.io/schemas/1.36.0"
    assert agent.scope == "mana-ai"
    assert agent.resource["service.name"] == "mana-ai"
    assert agent.resource["service.instance.id"] == "tracer-1"
    chats = sorted((s for s in spans if s.name == "chat agent-model"), key=lambda s: s.start_ns)
    assert len(chats) == 4  # three rounds and the summary
    round_1, round_2, summary, round_3 = chats
    compaction = one(spans, "compaction")
    # by round and position: the two reads of round 1 start within the same clock tick
    clocks = sorted(
        (s for s in spans if s.name == "execute_tool clock_now"),
        key=lambda s: (s.attributes["mana_ai.round"], s.attributes["mana_ai.tool.position"]),
    )
    delete = one(spans, "execute_tool notes_delete")
    assert len(clocks) == 3 and len(spans) == 1 + 4 + 1 + 4
    for child in (round_1, round_2, round_3, compaction, *clocks, delete):
        assert child.parent_id == agent.span_id, child.name
    assert summary.parent_id == compaction.span_id
    assert all(agent.start_ns <= s.start_ns <= s.end_ns <= agent.end_ns for s in spans)
    assert round_2.end_ns <= compaction.start_ns <= compaction.end_ns <= round_3.start_ns

    # invoke_agent: who, what, and how it ended
    attributes = agent.attributes
    assert attributes == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.system": "openai",
        "gen_ai.agent.name": "clock-agent",
        "gen_ai.agent.id": str(it["agent_id"]),
        "gen_ai.conversation.id": str(it["id"]),
        "gen_ai.request.model": "agent-model",
        "enduser.id": "u1",
        "mana_ai.mission.id": it["mission_id"],
        "mana_ai.iteration.id": it["id"],
        "mana_ai.iteration.attempt": 1,
        "mana_ai.mission.scheduled_for": attributes["mana_ai.mission.scheduled_for"],
        "gen_ai.usage.input_tokens": 200 + 790 + 300,
        "gen_ai.usage.output_tokens": 160 + 160 + 4,
        "mana_ai.rounds": 3,
        "mana_ai.stop_reason": "final_answer",
    }
    assert agent.status == "UNSET" and "gen_ai.input.messages" not in attributes
    assert [(e.name, e.attributes) for e in agent.events] == [
        ("mana_ai.reads_overlapped", {"mana_ai.round": 1, "mana_ai.size": 2})
    ]

    # chat: the request, the answer, the retry and the fallback
    address = "127.0.0.1"
    assert round_1.kind == "CLIENT"
    assert round_1.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "agent-model",
        "server.address": address,
        "server.port": port,
        "mana_ai.round": 1,
        "mana_ai.llm.endpoint": "primary",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.response.model": "agent-model-2025",
        "gen_ai.response.id": round_1.attributes["gen_ai.response.id"],
        "gen_ai.usage.input_tokens": 200,
        "gen_ai.usage.output_tokens": 160,
    }
    assert round_1.attributes["gen_ai.response.id"].startswith("chatcmpl-fake-")
    assert [(e.name, e.attributes) for e in round_1.events] == [
        ("mana_ai.llm.retry", {"mana_ai.llm.attempt": 1, "error.type": "http_500"})
    ]
    assert round_2.attributes["mana_ai.round"] == 2 and round_2.events == ()
    # round 3 carried the compaction's reminder, and the fallback answered it
    assert round_3.attributes["mana_ai.round"] == 3
    assert round_3.attributes["mana_ai.reminders"] == ("compacted",)
    assert round_3.attributes["mana_ai.llm.endpoint"] == "fallback"
    assert round_3.attributes["server.port"] == fallback_port
    assert [(e.name, e.attributes) for e in round_3.events] == [
        ("mana_ai.llm.fallback", {"error.type": "LLMStatusError"})
    ]
    assert all(c.status == "UNSET" for c in chats)

    # compaction and its summariser's request
    assert compaction.kind == "INTERNAL" and compaction.status == "UNSET"
    assert compaction.attributes["mana_ai.round"] == 3
    assert compaction.attributes["mana_ai.compaction.folded_turns"] == 1
    assert compaction.attributes["gen_ai.request.model"] == "agent-model"
    before = compaction.attributes["mana_ai.compaction.tokens_before"]
    assert before > compaction.attributes["mana_ai.compaction.tokens_after"] > 0
    assert "mana_ai.round" not in summary.attributes
    assert summary.attributes["gen_ai.request.max_tokens"] == 250

    # execute_tool: the call, the gate's decision, the outcome
    assert clocks[0].kind == "INTERNAL" and clocks[0].status == "UNSET"
    assert clocks[0].attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "clock_now",
        "gen_ai.tool.call.id": clocks[0].attributes["gen_ai.tool.call.id"],
        "gen_ai.tool.type": "function",
        "mana_ai.round": 1,
        "mana_ai.tool.position": 0,
        "mana_ai.tool.policy_hint": "read",
        "mana_ai.policy.verdict": "allow",
        "mana_ai.policy.reason": "allowed",
        "mana_ai.policy.mode": "log-only",
    }
    assert clocks[0].attributes["gen_ai.tool.call.id"].startswith("call_fake_")
    assert clocks[1].attributes["mana_ai.tool.position"] == 1
    assert clocks[2].attributes["mana_ai.round"] == 2
    # log-only: the rules would deny the delete (no opt-in), it ran, and found no note
    assert delete.attributes["mana_ai.policy.verdict"] == "deny"
    assert delete.attributes["mana_ai.policy.reason"] == "destructive_not_opted_in"
    assert delete.attributes["mana_ai.policy.mode"] == "log-only"
    assert delete.attributes["mana_ai.tool.policy_hint"] == "destructive"
    assert delete.attributes["mana_ai.tool.position"] == 2
    assert delete.attributes["error.type"] == "tool_error"
    assert delete.status == "ERROR" and delete.status_message == ""  # no payload by default
    assert "gen_ai.tool.call.arguments" not in delete.attributes
    # a destructive call runs after the reads
    assert max(clocks[0].end_ns, clocks[1].end_ns) <= delete.start_ns

    # the gen_ai.client.* metrics, beside the Prometheus ones
    points = receiver.metric_points()
    durations = [p for p in points if p.metric == "gen_ai.client.operation.duration"]
    tokens = [p for p in points if p.metric == "gen_ai.client.token.usage"]
    assert {p.unit for p in durations} == {"s"} and {p.unit for p in tokens} == {"{token}"}
    assert sum(p.count for p in durations) == 4
    assert durations[0].bounds[:3] == (0.01, 0.02, 0.04)
    inputs = [p for p in tokens if p.attributes["gen_ai.token.type"] == "input"]
    assert (
        sum(p.sum for p in inputs)
        == 200 + 790 + 300 + summary.attributes["gen_ai.usage.input_tokens"]
    )
    assert all(p.attributes["gen_ai.request.model"] == "agent-model" for p in points)
    assert all("gen_ai.response.model" not in p.attributes for p in points)


def test_with_tracing_off_no_opentelemetry_module_is_loaded() -> None:
    # what `mana-ai worker` imports to run missions; tracing's own modules load only when on
    script = (
        "import sys\n"
        "import worker.cli.daemon_cli, worker.daemon.app, worker.daemon.serve\n"
        "import worker.run.runner, worker.llm.chat_models, worker.tracing.hooks\n"
        "from worker.settings import load_settings\n"
        "assert load_settings().tracing.otel == 'off'\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MANA_AI_"))}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


EXITING = """
import sys, time
from worker.tracing.setup import open_tracing

tracing = open_tracing(worker_id="w", capture_content=False, environ={
    "OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1]})
for n in range(50):
    tracing.tracer.start_span(f"span {n}").end()
tracing.operation_duration.record(1.5, {"gen_ai.operation.name": "chat"})
print(time.monotonic(), flush=True)
print(tracing.shutdown(), flush=True)
"""


@pytest.mark.parametrize("mode", ["black_hole", "dropping", "refused"])
def test_a_dead_collector_holds_the_stop_and_the_exit_of_a_process_for_the_bound_only(
    mode: str,
) -> None:
    # before: Tracing.shutdown waited 5 s, then the meter provider's atexit hook exported
    # once more (10 s against a black hole); measured from the moment the process starts
    # stopping, so that its start-up (imports) is not in the figure
    pytest.importorskip("opentelemetry.sdk", reason="tracing needs the [otel] extra")
    from tests.fakes.otlp_receiver import DeadCollector
    from worker.tracing.setup import SHUTDOWN_S

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MANA_AI_"))}
    with DeadCollector(mode) as dead:  # type: ignore[arg-type]
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = dead.endpoint
        process = subprocess.Popen(
            [sys.executable, "-c", EXITING, dead.endpoint],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        stopping = float(process.stdout.readline() or "nan")
        out, err = process.communicate(timeout=60)
        exited = time.monotonic()
    assert process.returncode == 0, err
    assert out.strip() == "False"  # dropped, and said so
    assert "did not take the last spans and metrics" in err
    assert exited - stopping < SHUTDOWN_S + 1.5, err


INVENTED = [  # (what kind, the name a model invents, what would give it away in any form)
    ("very long", "zz_long_" + "y" * 3008, ("zz_long_",)),
    ("control characters", "zz_ctrl\x1b]0;pwned\x07\u202e\r\n\x00", ("zz_ctrl",)),
    ("an offered name and a suffix", "clock_now_zz_suffix", ("clock_now_zz",)),
    ("an offered name and an invisible one", "clock_now\u200b", ("clock_now\u200b", "u200b")),
    ("unicode", "zz_ünïcødé_工具_🛠️", ("zz_ünïcødé", "工具")),
    ("an MCP server's shape", "zz_server__tool", ("zz_server",)),
]
ENDPOINT_CHOSE = {  # what the endpoint answers besides: an id, a model, a finish reason
    "id": "zz_id_\x1b[2J" + "i" * 3000,
    "model": "zz_model_\u202e" + "m" * 3000,
    "finish_reason": "zz_finish_" + "f" * 3000,
}


def exported_texts(spans: list[ReceivedSpan]) -> list[str]:
    """Every text a span carries: its name, status message, attribute values (arrays
    flattened), its events' names and attribute values."""

    def texts(attributes: dict[str, Any]) -> list[str]:
        found = []
        for value in attributes.values():
            values = value if isinstance(value, tuple) else (value,)
            found += [str(v) for v in values]
        return found

    found = []
    for span in spans:
        found += [span.name, span.status_message, *texts(span.attributes)]
        for event in span.events:
            found += [event.name, *texts(event.attributes)]
    return found


@pytest.mark.parametrize("capture", [False, True], ids=["content off", "content on"])
async def test_names_a_model_invented_are_content_and_what_the_endpoint_chose_is_bounded(
    db: AsyncEngine, database_url: str, receiver: OtlpReceiver, capture: bool
) -> None:
    from prometheus_client import REGISTRY, generate_latest

    from worker.terminal_text import is_hidden
    from worker.tracing.chosen import MAX_CHOSEN_CHARS, OTHER, bounded
    from worker.tracing.setup import CONTENT_CHARS

    await add_mission(db, cron=None, agent="inventor", objective="What time is it?")
    async with db.begin() as conn:
        await conn.execute(update(agents).values(allowed_tools=["clock_now"]))
    invented = [name for _, name, _ in INVENTED]
    with FakeLLMServer() as llm:
        first = chat_completion_body(tool_calls=[("clock_now", {}), *((n, {}) for n in invented)])
        first |= {"id": ENDPOINT_CHOSE["id"], "model": ENDPOINT_CHOSE["model"]}
        first["choices"][0]["finish_reason"] = ENDPOINT_CHOSE["finish_reason"]
        llm.enqueue(json=first)
        llm.enqueue_completion(content="It is noon.")
        settings = load_settings(
            database_url=database_url,
            llm_base_url=llm.base_url,
            worker_id="inventor-1",
            otel="on",
            otel_capture_content=capture,
        )
        async with open_app(settings) as app:
            assert await app.worker.run_once() == ["succeeded"]
    spans = receiver.spans()
    texts = exported_texts(spans)
    labels = [
        str(value) for point in receiver.metric_points() for value in point.attributes.values()
    ]
    prometheus = generate_latest(REGISTRY).decode()
    assert 'mana_ai_tool_calls_total{outcome="error",tool="(unknown)"}' in prometheus

    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert sorted(s.name for s in tools) == ["execute_tool"] * len(INVENTED) + [
        "execute_tool clock_now"
    ]
    unknown = [s for s in tools if s.name == "execute_tool"]
    assert all(s.attributes["error.type"] == "not_run" for s in unknown)
    names = sorted(s.attributes["gen_ai.tool.name"] for s in unknown)
    for kind, _, giveaways in INVENTED:
        # never a metric label, captured or not: each would be a new series
        for giveaway in giveaways:
            assert all(giveaway not in label for label in labels), kind
            assert giveaway not in prometheus, kind
        if not capture:
            for giveaway in giveaways:
                assert all(giveaway not in text for text in texts), kind
    if capture:  # each one, cut and escaped, as the tool's name of its span
        # (as the model's text enters a run: made storable, planner.json_text.storable_text)
        assert names == sorted(bounded(storable_text(name)) for name in invented)
        assert all(len(n) <= MAX_CHOSEN_CHARS + 1 and not any(map(is_hidden, n)) for n in names)
        assert all(len(text) <= CONTENT_CHARS + 1 for text in texts)  # prompts, payloads: cut
    else:
        assert names == [OTHER] * len(INVENTED)

    # what the endpoint chose: there, cut and escaped, captured or not
    chat = next(s for s in spans if "gen_ai.response.id" in s.attributes)
    chosen = [
        chat.attributes["gen_ai.response.id"],
        chat.attributes["gen_ai.response.model"],
        *chat.attributes["gen_ai.response.finish_reasons"],
    ]
    assert [c[:7] for c in chosen] == ["zz_id_\\", "zz_mode", "zz_fini"]
    assert all(len(c) <= MAX_CHOSEN_CHARS + 1 and not any(map(is_hidden, c)) for c in chosen)
    for value in ENDPOINT_CHOSE.values():
        assert all(value[10:60] not in label for label in labels)
    ids = [s.attributes["gen_ai.tool.call.id"] for s in tools]
    assert all(len(i) <= MAX_CHOSEN_CHARS + 1 for i in ids)
