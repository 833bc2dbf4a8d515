"""Agents' MCP servers as tool sources, against a real MCP server on stdio
(``tests/fakes/mcp_stdio_server.py``) and real PostgreSQL: the runner lists the tools at the
start of an iteration, namespaces them, gates and records their calls like built-ins, and
an unusable server gives a readable reason (or fails the iteration when it is required)."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest
from planner.testing import ScriptedChatModel, final_answer, tool_calls
from tests.fakes.mcp_raw import GOOD_TOOLS, LEFT_OUT
from tests.integration.worker_harness import iterations, make_worker, mission_row, policy_setup
from worker.db.tables import tool_invocations
from worker.errors import NotFoundError
from worker.mcp.sources import McpToolSources
from worker.queries.missions import AdminStore
from worker.queries.user_policy import PolicyStore
from worker.store.agent_servers import McpServerConfig

FAKE = str(Path(__file__).resolve().parents[1] / "fakes" / "mcp_stdio_server.py")


def stdio(name: str, *args: str, **extra: Any) -> McpServerConfig:
    return McpServerConfig(
        name=name, transport="stdio", command=sys.executable, args=(FAKE, *args), **extra
    )


async def mission_for(engine: AsyncEngine, servers: list[McpServerConfig]) -> int:
    """A one-shot mission due now, of agent ``a1`` (owner ``u1``) with ``servers``; the
    agent is made on first use."""
    admin = AdminStore(engine)
    try:
        agent = await admin.agent_by_name("a1")
    except NotFoundError:
        agent = await admin.add_agent(
            name="a1", owner_user_id="u1", system_prompt="Be brief.", mcp_servers=servers
        )
    mission = await admin.add_mission(
        agent_id=agent["id"],
        objective="Use the tools.",
        cron=None,
        timezone="UTC",
        next_run_at=datetime.now(UTC),
    )
    return int(mission["id"])


async def calls(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(tool_invocations).order_by(tool_invocations.c.id))
        return [dict(r) for r in rows.mappings()]


def tool_names(request: CompletionRequest) -> set[str]:
    return {t["function"]["name"] for t in request.tools}


async def test_a_mission_calls_its_agents_mcp_tool_and_stores_the_call_with_its_decision(
    db: AsyncEngine, tmp_path: Path
) -> None:
    log = tmp_path / "appended.txt"
    await mission_for(db, [stdio("fs", "--log", str(log))])
    llm = ScriptedChatModel(
        [
            tool_calls(("fs__notes_append", {"text": "hello"}), ("fs__echo", {"text": "hi"})),
            final_answer("Done."),
        ]
    )
    worker = make_worker(db, llm, policy=policy_setup(db, "enforce"))
    assert await worker.run_once() == ["succeeded"]

    offered = tool_names(llm.requests[0])
    assert {"fs__echo", "fs__notes_append", "fs__wipe", "notes_list", "clock_now"} <= offered
    assert log.read_text() == "hello\n"  # it ran on the server
    [it] = await iterations(db)
    # the write went with its idempotency key, for a server that applies each at most once
    assert log.with_suffix(".keys").read_text() == f"{it['id']}:1:0\n"
    assert it["status"] == "succeeded" and it["error"] is None
    rows = await calls(db)
    assert [(r["tool"], r["outcome"], r["consumer"]) for r in rows] == [
        ("fs__notes_append", "ok", "mission"),
        ("fs__echo", "ok", "mission"),
    ]
    assert rows[0]["result"] == {"appended": "hello"}
    assert rows[1]["result"] == "hi"
    for row in rows:
        decision = row["policy_decision"]
        assert decision["verdict"] == "allow" and decision["mode"] == "enforce"
        assert row["iteration_id"] == it["id"]


async def test_a_destructive_mcp_tool_needs_the_opt_in_to_its_tool_or_scope(
    db: AsyncEngine, tmp_path: Path
) -> None:
    log = tmp_path / "appended.txt"
    await mission_for(db, [stdio("fs", "--log", str(log))])
    llm = ScriptedChatModel([tool_calls(("fs__wipe", {})), final_answer("Could not.")])
    worker = make_worker(db, llm, policy=policy_setup(db, "enforce"))
    assert await worker.run_once() == ["succeeded"]
    assert not log.exists()  # refused: never sent to the server
    [refused] = await calls(db)
    assert refused["outcome"] == "denied"
    assert refused["error"].startswith(
        "denied by policy (destructive_not_opted_in): fs__wipe is destructive and user 'u1' "
        "has not opted in to it (nor to its scope 'mcp:fs')"
    )

    await PolicyStore(db).allow_destructive("u1", "mcp:fs")  # the whole server's scope
    await mission_for(db, [])
    llm2 = ScriptedChatModel([tool_calls(("fs__wipe", {})), final_answer("Wiped.")])
    assert await make_worker(db, llm2, policy=policy_setup(db, "enforce")).run_once() == [
        "succeeded"
    ]
    assert log.read_text() == "WIPED\n"
    assert (await calls(db))[-1]["outcome"] == "ok"


async def test_with_its_servers_down_the_iteration_records_why_and_runs_with_the_rest(
    db: AsyncEngine,
) -> None:
    mission = await mission_for(
        db,
        [
            stdio("gone", "--mode", "exit"),
            McpServerConfig(
                name="web",
                transport="http",
                url="http://user:hunter2@127.0.0.1:9/mcp?key=sk-secret",
                headers={"Authorization": "Bearer sk-header-secret"},
            ),
            McpServerConfig(name="nope", transport="stdio", command="/no/such/mcp-server"),
        ],
    )
    llm = ScriptedChatModel([tool_calls(("clock_now", {})), final_answer("It is late.")])
    worker = make_worker(db, llm, policy=policy_setup(db, "enforce"))
    assert await worker.run_once() == ["succeeded"]

    assert not any(name.startswith(("gone__", "web__")) for name in tool_names(llm.requests[0]))
    [it] = await iterations(db)
    assert it["status"] == "succeeded"
    error = it["error"]
    assert "MCP server gone (stdio: " in error
    assert "could not connect and list its tools: Connection closed" in error
    assert "MCP server web (http: http://user:***@127.0.0.1:9/mcp?key=***): could not connect" in (
        error
    )
    assert "MCP server nope (stdio: /no/such/mcp-server): could not connect and list its " in (
        error
    )
    assert "this run went on without its tools" in error
    assert "hunter2" not in error and "sk-secret" not in error and "sk-header-secret" not in error
    assert (await mission_row(db, mission))["last_error"] == error
    assert [c["tool"] for c in await calls(db)] == ["clock_now"]


async def test_a_required_server_that_is_down_fails_the_iteration_without_calling_the_llm(
    db: AsyncEngine,
) -> None:
    await mission_for(db, [stdio("gone", "--mode", "exit", required=True)])
    llm = ScriptedChatModel([])
    worker = make_worker(db, llm, policy=policy_setup(db, "enforce"))
    assert await worker.run_once() == ["failed"]
    [it] = await iterations(db)
    assert it["stop_reason"] == "tool_source_unavailable"
    assert it["error"].startswith("MCP server gone (stdio: ")
    assert it["error"].endswith("(the server is required)")
    assert llm.requests == []


async def test_a_server_that_never_answers_is_left_out_after_the_list_timeout(
    db: AsyncEngine,
) -> None:
    await mission_for(db, [stdio("hang", "--mode", "hang")])
    llm = ScriptedChatModel([final_answer("Nothing to do.")])
    sources = McpToolSources(list_timeout_s=0.5)
    worker = make_worker(db, llm, policy=policy_setup(db, "enforce"), tool_sources=sources)
    assert await worker.run_once() == ["succeeded"]
    [it] = await iterations(db)
    assert "MCP server hang (stdio: " in it["error"]
    assert (
        "could not connect and list its tools within 0.5 s (MANA_AI_MCP_LIST_TIMEOUT_S)"
        in (it["error"])
    )


async def test_odd_tools_are_left_out_one_by_one_and_the_others_work(db: AsyncEngine) -> None:
    await mission_for(db, [stdio("odd", "--mode", "odd")])
    llm = ScriptedChatModel([tool_calls(("odd__echo", {"text": "still here"})), final_answer("ok")])
    worker = make_worker(db, llm, policy=policy_setup(db, "enforce"))
    assert await worker.run_once() == ["succeeded"]

    offered = {t["function"]["name"]: t for t in llm.requests[0].tools}
    odd = sorted(n for n in offered if n.startswith("odd__"))
    assert odd == [
        "odd___n_code__ool",  # "Ünïcode/τool"
        "odd__echo",
        "odd__huge",
        "odd__read_file",  # "read file"
        "odd__read_file_c9f8123b",  # "read_file": the same name, told apart by a hash
        "odd__tttttttttttttttttttttttttttttttttttttttttttttttttt_0fe47695",  # 100 characters
    ]
    assert all(len(name) <= 64 for name in odd)
    assert len(offered["odd__huge"]["function"]["description"]) == 4002
    [it] = await iterations(db)
    error = it["error"]
    assert "MCP server odd: tool 'remote ref' was left out: invalid JSON schema" in error
    assert "only references into the schema itself" in error
    assert "MCP server odd: a tool without a name was left out" in error
    assert "MCP server odd: tool 'bad schema' was left out" in error
    [call] = await calls(db)
    assert (call["tool"], call["outcome"], call["result"]) == ("odd__echo", "ok", "still here")


async def test_one_bad_tool_is_left_out_alone_and_the_servers_good_tools_run(
    db: AsyncEngine,
) -> None:
    # tools/list holds entries that break the MCP specification (which made the SDK refuse
    # the whole listing) and others no agent can be given, next to good ones
    await mission_for(db, [stdio("raw", "--mode", "raw")])
    llm = ScriptedChatModel(
        [
            tool_calls(("raw__echo", {"text": "still here"}), ("raw__note", {"text": "n"})),
            final_answer("ok"),
        ]
    )
    assert await make_worker(db, llm, policy=policy_setup(db, "enforce")).run_once() == [
        "succeeded"
    ]
    offered = {name for name in tool_names(llm.requests[0]) if name.startswith("raw__")}
    assert offered == {f"raw__{name}" for name in GOOD_TOOLS}
    [it] = await iterations(db)
    assert it["status"] == "succeeded"
    # the first reasons, then a count (worker.run.outcomes.MAX_PROBLEMS_SHOWN); all are logged
    assert it["error"] == "; ".join(f"MCP server raw: {reason}" for reason in LEFT_OUT[:5]) + (
        f"; and {len(LEFT_OUT) - 5} more (see the worker's log)"
    )
    rows = sorted(await calls(db), key=lambda row: str(row["tool"]))
    assert [(r["tool"], r["outcome"], r["result"]) for r in rows] == [
        ("raw__echo", "ok", "still here"),
        ("raw__note", "ok", "noted: n"),
    ]


async def test_a_garbled_reply_fails_its_call_at_once_and_a_writes_outcome_is_unknown(
    db: AsyncEngine,
) -> None:
    await mission_for(db, [stdio("raw", "--mode", "raw")])
    llm = ScriptedChatModel(
        [
            tool_calls(
                ("raw__garbled", {"kind": "surrogate"}),
                ("raw__garbled_note", {"kind": "no_id"}),
                ("raw__huge", {"size": 50_000_000}),
            ),
            final_answer("ok"),
        ]
    )
    worker = make_worker(db, llm, tool_sources=McpToolSources(call_timeout_s=35), tool_timeout_s=30)
    started = time.monotonic()
    assert await worker.run_once() == ["succeeded"]
    assert time.monotonic() - started < 20  # generous: each call could have waited 30 s
    # a write is recorded as it starts, reads when their round ends: by name
    read, write, huge = sorted(await calls(db), key=lambda row: str(row["tool"]))
    unreadable = (
        "MCP server raw: its reply could not be read: it is JSON with a lone UTF-16 surrogate "
        "(\\ud800), which is not valid Unicode"
    )
    assert (read["outcome"], read["error"]) == (
        "error",
        unreadable,
    )
    assert write["outcome"] == "error"
    assert write["error"].startswith(unreadable)
    assert write["error"].endswith(
        "; its outcome is unknown: the write may or may not have taken effect, check before "
        "retrying it"
    )
    assert huge["outcome"] == "ok"
    assert huge["result"].startswith("x" * 20_000 + "\n[cut while it was read: the reply had ")


async def test_results_are_cut_errors_are_errors_and_the_env_reaches_the_server(
    db: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await mission_for(db, [stdio("fs", env={"FAKE_MCP_SECRET": "s3cr3t-value"})])
    llm = ScriptedChatModel(
        [
            tool_calls(
                ("fs__big", {"size": 50_000}),
                ("fs__fails", {}),
                ("fs__echo", {"text": "$secret"}),
            ),
            final_answer("ok"),
        ]
    )
    sources = McpToolSources(max_result_chars=1_000)
    caplog.set_level(logging.DEBUG)
    worker = make_worker(db, llm, policy=policy_setup(db, "log-only"), tool_sources=sources)
    assert await worker.run_once() == ["succeeded"]
    big, fails, echo = await calls(db)
    assert big["result"].startswith("x" * 1_000 + "\n[cut: the result has 50000 characters")
    assert fails["outcome"] == "error"
    assert fails["error"] == "the disk is full"
    # --mcp-env reached the process, which echoed it; a secret, it is masked in what is stored
    assert echo["result"] == "***"
    tool_message = json.loads(llm.requests[1].messages[-2].content or "{}")
    assert tool_message == {"error": "the disk is full"}
    assert "s3cr3t-value" not in caplog.text


async def test_a_call_past_the_tool_timeout_is_stopped(db: AsyncEngine) -> None:
    await mission_for(db, [stdio("fs")])
    llm = ScriptedChatModel([tool_calls(("fs__slow", {"seconds": 30})), final_answer("ok")])
    worker = make_worker(db, llm, tool_timeout_s=0.5)
    assert await worker.run_once() == ["succeeded"]
    [call] = await calls(db)
    assert call["error"] == "fs__slow timed out after 0.5 s and was stopped; it returned nothing"


def stderr_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "worker.mcp.stdio" and "stderr" in r.getMessage()
    ]


async def test_a_servers_stderr_is_logged_line_by_line_naming_it_and_never_copied_raw(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    import contextlib

    caplog.set_level(logging.INFO, logger="worker.mcp.stdio")
    server = stdio("hs", "--mode", "stderr")
    async with contextlib.AsyncExitStack() as stack:
        opened = await McpToolSources().open([server], stack)
        assert "hs__echo" in {t.name for t in opened.tools}  # the session works meanwhile
    named = f"MCP server {server.describe()} (stderr): "
    assert stderr_records(caplog) == [
        named + "boom \\u001b[31m",  # the tester's: a raw ESC reached the terminal
        named + "title \\u001b]0;pwned\\u0007 c1 \\u009b31m bidi \\u202eevil",
        named + "not utf-8 \\xff\\xfe",
        named + "long " + "x" * 2043 + " … (7957 more bytes not logged)",
    ]
    # nothing of it went to this process's own stderr (the SDK's way: the worker's fd 2)
    assert "boom" not in capfd.readouterr().err


async def test_a_stderr_flood_neither_blocks_the_server_nor_floods_the_log(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    import contextlib

    caplog.set_level(logging.INFO, logger="worker.mcp.stdio")
    log = tmp_path / "server.log"
    async with contextlib.AsyncExitStack() as stack:
        opened = await McpToolSources().open(
            [stdio("fl", "--mode", "stderrflood", "--log", str(log))], stack
        )
        assert "fl__echo" in {t.name for t in opened.tools}
    assert log.read_text() == "flooded\n"  # it wrote all 100,000 lines and 5 MB: read, dropped
    records = stderr_records(caplog)
    assert 100 <= len(records) < 1000  # a burst, then 10 a second, of 100,001 lines
    assert "line(s) before it not logged: more than 10 a second" in " ".join(records)
    [endless] = [r for r in records if "endless" in r]
    assert f" … ({5 * 1024 * 1024 - 2048} more bytes not logged)" in endless


async def test_with_json_logs_a_servers_stderr_is_json_lines_too(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    monkeypatch.setenv("MANA_AI_LOG_FORMAT", "json")
    mcp = f"hs=stdio:{sys.executable} {FAKE} --mode stderr"
    code, _, err = await asyncio.to_thread(
        run, "agents", "add", "--name", "a", "--owner", "u", "--mcp", mcp
    )
    assert code == 0, err
    added = await asyncio.to_thread(
        run, "missions", "add", "--agent", "a", "--objective", "x", "--due-now"
    )
    assert added[0] == 0
    code, _, err = await asyncio.to_thread(run, "tick", "--once")
    assert code == 1  # the LLM is unreachable: the run fails
    logged = [line for line in err.splitlines() if not line.startswith("mana-ai: ")]
    records = [json.loads(line) for line in logged]  # every log line is JSON
    assert all(line.isprintable() for line in err.splitlines())
    stderr = [r["msg"] for r in records if r["logger"] == "worker.mcp.stdio"]
    assert stderr[0].startswith("MCP server hs (stdio: ")
    assert stderr[0].endswith(" (stderr): boom \\u001b[31m")
