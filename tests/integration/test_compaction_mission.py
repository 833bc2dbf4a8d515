"""Compaction in real missions (real PostgreSQL, the fake LLM server over HTTP): the archive,
the metrics, the reminder, `mana-ai replay` with the folded turns in place, `missions
history`, and `replay --rerun` under the same and under other settings."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import (
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    TokenUsage,
    ToolCall,
    ToolSpec,
)
from planner.compaction import SUMMARY_PROMPT
from planner.policy import PolicyConfig
from planner.testing import FunctionChatModel, final_answer
from tests.fakes import FakeLLMServer
from tests.fakes.llm_server import chat_completion_body
from tests.integration.test_durable_iterations import expire_lease
from tests.integration.worker_harness import add_mission, iterations, make_worker, policy_setup
from worker.admin.replay import restored_log
from worker.admin.rerun import RerunConfig, rerun_iteration
from worker.cli import main
from worker.db.tables import agents, compacted_turns, mission_iterations
from worker.llm import OpenAICompatibleChatModel
from worker.queries.missions import AdminStore
from worker.run.compaction_setup import CompactionSetup
from worker.tools import builtin_tools

MAX_CTX = 1000
TOOLS = ["clock_now", "notes_delete"]
"""The agent's tools: their definitions count toward the small context (about 190 tokens)."""


def agent_tools(db: AsyncEngine) -> list[ToolSpec]:
    return [t for t in builtin_tools(db) if t.name in TOOLS]


THINKING = "Let me look at the clock once more before I answer. " * 12  # ~160 tokens


def script_long_mission(server: FakeLLMServer, *, summary: Any = "default") -> None:
    """Four rounds of clock_now whose usage climbs to 950 of 1,000 tokens (92 % is 920):
    the compaction runs before round 5 and folds turns 1-3 (the last turn is kept). Round 2
    deletes a note the owner never opted in to delete (log-only lets it run)."""
    usage = [(200, 160), (400, 160), (600, 160), (790, 160)]
    for round_no, (prompt, completion) in enumerate(usage, start=1):
        calls: list[tuple[str, dict[str, Any] | str]] = [("clock_now", {})]
        if round_no == 2:
            calls.append(("notes_delete", {"id": 99}))
        server.enqueue_completion(
            content=f"Round {round_no}. {THINKING}",
            tool_calls=calls,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )
    if summary == "default":
        server.enqueue_completion(content="Facts found: the clock was read three times.")
    elif summary is not None:
        summary(server)


async def run(db: AsyncEngine, server: FakeLLMServer) -> dict[str, Any]:
    llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
    try:
        worker = make_worker(
            db,
            llm,
            policy=policy_setup(db, "log-only", PolicyConfig()),
            compaction=CompactionSetup(llm=llm, max_ctx=10**6),
            tools_for=lambda mission: agent_tools(db),
        )
        await worker.run_once()
    finally:
        await llm.aclose()
    return (await iterations(db))[-1]


async def long_mission(db: AsyncEngine) -> int:
    mission_id = await add_mission(db, cron=None)
    async with db.begin() as conn:
        await conn.execute(
            update(agents).values(
                compact_max_ctx=MAX_CTX, max_rounds=8, model="agent-model-x", allowed_tools=TOOLS
            )
        )
    return mission_id


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def cli(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    *argv: str,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://127.0.0.1:9/v1")  # never asked
    monkeypatch.setenv("MANA_AI_POLICY_MODE", "log-only")
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


async def test_a_long_mission_compacts_once_archives_it_and_replay_restores_it(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mission_id = await long_mission(db)
    triggered = sample("mana_ai_compactions_triggered_total")
    folded_count = sample("mana_ai_compacted_turns_count")
    folded_sum = sample("mana_ai_compacted_turns_sum")
    with FakeLLMServer() as server:
        script_long_mission(server)
        server.enqueue_completion(content="It is late.")
        it = await run(db, server)
        requests = list(server.requests)

    assert it["status"] == "succeeded" and it["stop_reason"] == "final_answer"
    assert it["rounds"] == 5 and len(requests) == 6  # 5 rounds and one summarisation
    summarise, round_5 = requests[4], requests[5]
    # the summariser's context is the mission's (1,000 tokens, a quarter kept for its answer):
    # the oldest folded message is left out of what it reads (it is still folded and archived)
    to_summarise = summarise["messages"][-1]["content"]
    assert to_summarise.startswith("[1 earlier message(s) left out to fit]")
    assert "Round 2." in to_summarise and "Round 3." in to_summarise
    assert "Round 4." not in to_summarise
    assert summarise["max_tokens"] == 250
    assert summarise["model"] == "agent-model-x"  # MANA_AI_COMPACT_MODEL unset: the mission's
    sent = [m.get("content") or "" for m in round_5["messages"]]
    assert not any("Round 1." in text or "Round 3." in text for text in sent)
    assert any(t.startswith("<summary of 3 earlier turn(s)") for t in sent)
    assert any("the clock was read three times" in t for t in sent)
    assert any(t.startswith("<reminder>") and "summar" in t for t in sent)  # compacted

    async with db.connect() as conn:
        [row] = (await conn.execute(select(compacted_turns))).mappings().all()
    assert row["iteration_id"] == it["id"] and row["mission_id"] == mission_id
    assert row["round"] == 5 and row["folded_turns"] == 3 and row["error"] is None
    assert [m["role"] for m in row["folded"]][:3] == ["assistant", "tool", "assistant"]
    assert row["folded"][0]["content"].startswith("Round 1.")
    assert row["summary"] == "Facts found: the clock was read three times."
    assert row["model"] == "agent-model-x"
    assert row["tokens_after"] < row["tokens_before"]
    assert it["messages"][2]["content"].startswith("<summary of 3 earlier turn(s)")

    assert sample("mana_ai_compactions_triggered_total") == triggered + 1
    assert sample("mana_ai_compacted_turns_count") == folded_count + 1
    assert sample("mana_ai_compacted_turns_sum") == folded_sum + 3

    iteration = await AdminStore(db).get_iteration(it["id"])
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"])
    )
    assert code == 0, out
    marker = out.index("== compaction 1 before round 5: 3 turn(s) folded")
    assert out.index("> Facts found: the clock was read three times.") > marker
    for round_no in (1, 2, 3):  # back in place, between the marks, in order
        assert out.index(f"| [assistant] Round {round_no}.") > marker
    assert out.index("| -- round 1 --") < out.index("| -- round 3 --")
    end = out.index("== end of the turns compaction 1 folded ==")
    assert out.index("| [assistant] Round 3.") < end < out.index("-- round 4 --")
    assert "[assistant] Round 4." in out and "[assistant] It is late." in out
    assert "policy would deny: destructive_not_opted_in (log-only)" in out
    assert out.count("<summary of") == 0  # the summary message is replaced by the turns
    assert len(iteration["tool_invocations"]) == 5

    code, markdown = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"]), "--format", "markdown"
    )
    assert code == 0 and "## Compaction 1, before round 5: 3 turn(s) folded" in markdown
    assert "### Round 2 (folded by compaction 1)" in markdown

    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "missions", "history", str(mission_id)
    )
    assert code == 0, out
    assert f"iteration {it['id']}" in out
    assert "compaction 1 before round 5: 3 turn(s) folded" in out

    # today's settings are the recorded ones: nothing differs
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"]), "--rerun"
    )
    assert code == 0, out
    assert "no difference" in out, out
    assert "compared 5 policy decision(s) and outcome(s), 1 compaction(s)" in out

    # enforce would have refused the delete of round 2
    code, out = await asyncio.to_thread(
        cli,
        monkeypatch,
        capsys,
        database_url,
        "replay",
        str(it["id"]),
        "--rerun",
        env={"MANA_AI_POLICY_MODE": "enforce"},
    )
    assert code == 0, out
    assert (
        "round 2: notes_delete (call call_fake_" in out
        and "policy recorded would deny: destructive_not_opted_in (log-only), now denied: "
        "destructive_not_opted_in (enforce)"
        in out
    ), out
    assert "outcome recorded error, now denied" in out
    assert "clock_now" not in out.split("difference(s)")[1].split("note:")[0]


async def test_rerun_reports_other_compaction_points_reminders_and_limits(
    db: AsyncEngine,
) -> None:
    await long_mission(db)
    with FakeLLMServer() as server:
        script_long_mission(server)
        server.enqueue_completion(content="It is late.")
        it = await run(db, server)
    iteration = await AdminStore(db).get_iteration(it["id"])
    same = RerunConfig(
        tools=agent_tools(db),
        max_rounds=8,
        policy_mode="log-only",
        policy_config=PolicyConfig(),
        user_id="u1",
        compact_max_ctx=MAX_CTX,
    )
    assert (await rerun_iteration(iteration, same)).differences == []

    report = await rerun_iteration(
        iteration, same.__class__(**{**same.__dict__, "compact_max_ctx": 0})
    )
    kinds = {d["kind"] for d in report.differences}
    assert "compaction" in kinds and "reminders" in kinds  # no compaction, no reminder of it
    [compaction] = [d for d in report.differences if d["kind"] == "compaction"]
    assert compaction["recorded"] == "before round 5, 3 turn(s) folded"
    assert compaction["now"] == "(none)"

    report = await rerun_iteration(iteration, same.__class__(**{**same.__dict__, "max_rounds": 3}))
    stop = [d for d in report.differences if d["kind"] == "stop_reason"]
    assert stop and stop[0]["recorded"] == "final_answer" and stop[0]["now"] == "max_rounds"


@pytest.mark.parametrize(
    ("summariser_answer", "reason"),
    [
        (lambda s: s.enqueue(status=500, json={"error": {"message": "overloaded"}}), "llm_error"),
        (lambda s: s.enqueue_completion(content="   "), "unusable_summary"),
        (lambda s: s.enqueue_text("<html>not json</html>", content_type="text/html"), "llm_error"),
    ],
    ids=["server-error", "empty-summary", "garbage-body"],
)
async def test_a_failing_summariser_compacts_nothing_and_the_next_crossing_ends_the_run(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    summariser_answer: Any,
    reason: str,
) -> None:
    await long_mission(db)
    failures = sample("mana_ai_compaction_failures_total", {"reason": reason})
    triggered = sample("mana_ai_compactions_triggered_total")
    with FakeLLMServer() as server:
        script_long_mission(server, summary=summariser_answer)
        it = await run(db, server)
        requests = list(server.requests)

    # the endpoint reports 950 tokens, but the conversation's own estimate (the larger, which
    # the count trusts) is past the whole 1,000-token context: with nothing folded, round 5
    # would not fit, so it is not sent
    assert len(requests) == 5  # 4 rounds and the failed summarisation
    sent = [m.get("content") or "" for m in requests[3]["messages"]]
    assert any(t.startswith("Round 1.") for t in sent)  # nothing was folded
    assert it["status"] == "failed" and it["stop_reason"] == "context_exhausted"
    assert "tokens of the 1000-token context (compaction starts at 92%, 920 tokens)" in it["error"]
    assert "more than the whole context, and compacting could not help" in it["error"]
    assert "; the last compaction attempt: the summariser " in it["error"]  # and why
    assert it["rounds"] == 4 and len(it["messages"]) > 10  # the whole log is stored
    assert sample("mana_ai_compaction_failures_total", {"reason": reason}) == failures + 1
    assert sample("mana_ai_compactions_triggered_total") == triggered

    async with db.connect() as conn:
        [row] = (await conn.execute(select(compacted_turns))).mappings().all()
    assert row["error"].startswith(f"{reason}: ") and row["folded"] == []

    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"])
    )
    assert code == 0, out
    assert f"== compaction 1 tried before round 5 changed nothing: {reason}: " in out
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"]), "--rerun"
    )
    assert code == 0 and "no difference" in out, out


async def test_an_interrupted_run_keeps_its_archive_and_the_takeover_goes_on_compacted(
    db: AsyncEngine,
) -> None:
    mission_id = await long_mission(db)
    round_5 = asyncio.Event()
    rounds = iter(range(1, 100))

    async def victim_model(request: CompletionRequest) -> CompletionResponse:
        if request.messages[0].content == SUMMARY_PROMPT:
            return final_answer("Facts found: the clock was read three times.")
        n = next(rounds)
        if n <= 4:
            return CompletionResponse(
                message=ChatMessage(
                    role="assistant",
                    content=f"Round {n}. {THINKING}",
                    tool_calls=(ToolCall(id=f"c{n}", name="clock_now"),),
                ),
                usage=TokenUsage(prompt_tokens=200 * n - 10 * (n == 4), completion_tokens=160),
                finish_reason="tool_calls",
            )
        round_5.set()
        await asyncio.Event().wait()  # shut down while round 5 waits for the model
        raise AssertionError("unreachable")

    model = FunctionChatModel(victim_model)
    victim = make_worker(
        db,
        model,
        compaction=CompactionSetup(llm=model, max_ctx=10**6),
        tools_for=lambda mission: agent_tools(db),
    )
    [task] = await victim.tick()
    await asyncio.wait_for(round_5.wait(), 30)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"]) == ("failed", "interrupted")
    # the folded rounds and the summarisation still count (4 rounds, 2630 + 15 tokens)
    assert (it["rounds"], it["prompt_tokens"], it["completion_tokens"]) == (4, 2000, 645)
    assert it["messages"][2]["content"].startswith("<summary of 3 earlier turn(s)")
    async with db.connect() as conn:
        [row] = (await conn.execute(select(compacted_turns))).mappings().all()
    assert (row["attempt"], row["compaction_index"], row["folded_turns"]) == (1, 1, 3)

    heir_requests: list[CompletionRequest] = []

    def heir_model(request: CompletionRequest) -> CompletionResponse:
        heir_requests.append(request)
        return final_answer("It is late.")

    heir_llm = FunctionChatModel(heir_model)
    heir = make_worker(
        db,
        heir_llm,
        worker_id="heir",
        compaction=CompactionSetup(llm=heir_llm, max_ctx=10**6),
        tools_for=lambda mission: agent_tools(db),
    )
    await expire_lease(db, mission_id)
    assert await heir.run_once() == ["succeeded"]
    [request] = heir_requests  # no second compaction: the heir goes on from the compacted log
    assert request.messages[2].content.startswith("<summary of 3 earlier turn(s)")
    [it] = await iterations(db)
    assert it["attempts"][1]["resumed_after_round"] == 4
    assert (it["rounds"], it["prompt_tokens"], it["completion_tokens"]) == (5, 2010, 650)
    whole = restored_log(it["messages"], [row])
    assert [m.get("content", "")[:8] for m in whole if m["role"] == "assistant"] == [
        "Round 1.",
        "Round 2.",
        "Round 3.",
        "Round 4.",
        "It is la",
    ]


async def test_replay_refuses_what_it_cannot_show_with_a_reason(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = await asyncio.to_thread(cli, monkeypatch, capsys, database_url, "replay", "42")
    assert code == 1 and "no iteration with id 42" in out
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", "42", "--policy-mode", "enforce"
    )
    assert code == 2 and "--policy-mode goes with --rerun" in out

    await long_mission(db)
    with FakeLLMServer() as server:
        script_long_mission(server)
        server.enqueue_completion(content="It is late.")
        it = await run(db, server)
    async with db.begin() as conn:  # an archive edited by hand no longer fits the log
        await conn.execute(update(compacted_turns).values(start_index=0))
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"])
    )
    assert code == 1 and "the archive does not fit the log: compaction 1" in out
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "iterations", "show", str(it["id"])
    )
    assert code == 0 and "compactions: 1 (3 turn(s) folded" in out  # the log as stored
    # its rounds keep their numbers: the summary stands for rounds 1-3
    assert out.index("(rounds 1-3 were folded into the summary below") < out.index("-- round 4 --")
    assert "-- round 1 --" not in out and "(no answer)" not in out


async def test_rerun_refuses_an_iteration_without_a_conversation_and_corrupt_replies(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await long_mission(db)
    with FakeLLMServer() as server:
        server.enqueue_completion(content="Done.")
        it = await run(db, server)
    async with db.begin() as conn:  # what a budget_exhausted run stores: no conversation
        await conn.execute(update(mission_iterations).values(messages=[]))
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"]), "--rerun"
    )
    assert code == 1 and "stored no conversation to rerun" in out, out
    assert "no difference" not in out

    broken = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": 42},
    ]
    async with db.begin() as conn:
        await conn.execute(update(mission_iterations).values(messages=broken))
    code, out = await asyncio.to_thread(
        cli, monkeypatch, capsys, database_url, "replay", str(it["id"]), "--rerun"
    )
    assert code == 1 and "the recorded reply of round 1 cannot be read back" in out, out


async def test_rerun_tells_calls_with_one_id_apart(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await long_mission(db)
    body = chat_completion_body(tool_calls=[("notes_delete", {"id": 5}), ("clock_now", {})])
    for call in body["choices"][0]["message"]["tool_calls"]:
        call["id"] = "dup"  # some providers number calls per reply, or not at all
    with FakeLLMServer() as server:
        server.enqueue(json=body)
        server.enqueue_completion(content="Done.")
        it = await run(db, server)
    code, out = await asyncio.to_thread(
        cli,
        monkeypatch,
        capsys,
        database_url,
        "replay",
        str(it["id"]),
        "--rerun",
        "--policy-mode",
        "enforce",
        "--format",
        "markdown",
    )
    assert code == 0, out
    assert out.startswith("# Rerun of iteration")
    assert "notes\\_delete (call dup): policy recorded would deny" in out  # markdown-escaped
    assert "clock_now" not in out.split("difference(s)")[1].split("note:")[0], out


async def test_rerun_of_a_run_without_a_gate_reports_only_what_a_gate_would_refuse(
    db: AsyncEngine,
) -> None:
    await long_mission(db)
    with FakeLLMServer() as server:
        server.enqueue_completion(tool_calls=[("clock_now", {}), ("notes_delete", {"id": 5})])
        server.enqueue_completion(content="Done.")
        llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
        try:
            await make_worker(db, llm).run_once()  # no policy gate: mode off
        finally:
            await llm.aclose()
    [it] = await iterations(db)
    iteration = await AdminStore(db).get_iteration(it["id"])
    config = RerunConfig(
        tools=builtin_tools(db),
        max_rounds=8,
        policy_mode="log-only",
        policy_config=PolicyConfig(),
        user_id="u1",
    )
    report = await rerun_iteration(iteration, config)
    [difference] = report.differences  # clock_now runs either way: not a difference
    assert difference["tool"] == "notes_delete" and difference["recorded"] == "no gate (off)"
    assert difference["now"] == "would deny: destructive_not_opted_in (log-only)"

    without_clock = [t for t in builtin_tools(db) if t.name != "clock_now"]
    report = await rerun_iteration(iteration, dataclasses.replace(config, tools=without_clock))
    [outcome] = [d for d in report.differences if d["tool"] == "clock_now"]
    assert outcome["kind"] == "outcome" and outcome["recorded"] == "ok"
    assert outcome["now"].startswith("error (unknown tool")
    assert any("not offered today" in n and "clock_now" in n for n in report.notes)

    # recorded under a gate, the same call now never reaches it
    logged = [
        row | {"policy_decision": {"allow": True, "verdict": "allow", "mode": "log-only"}}
        for row in iteration["tool_invocations"]
    ]
    report = await rerun_iteration(
        iteration | {"tool_invocations": logged}, dataclasses.replace(config, tools=without_clock)
    )
    [policy] = [d for d in report.differences if d["kind"] == "policy" and d["tool"] == "clock_now"]
    assert policy["now"].startswith("not decided: the call never reached the gate (unknown tool")
