"""No command prints a terminal escape, a bidi control or another hidden character raw,
whatever the database holds.

The database is seeded the way it fills up for real (a mission run that called tools,
compacted and was reminded; MCP servers, tokens, opt-ins and rate limits given on the
command line), then every text the schema stores is made hostile: each text column and each
string inside a JSON column gets ``HOSTILE`` appended, the way a model, a tool, an MCP peer or
a hand-edited row could have written it. Then every command that prints stored text runs,
as people read it and with ``--json``, and nothing they print (stdout or stderr, log lines
included) may carry a hidden character raw.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import ARRAY, Text

from planner import CompletionRequest, CompletionResponse, TokenUsage
from planner.compaction import SUMMARY_PROMPT
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.cli_harness import as_json, command_names
from tests.integration.worker_harness import make_worker, policy_setup
from worker.db.tables import approval_requests, compacted_turns, metadata, mission_iterations
from worker.queries.admin_tokens import AdminTokenStore
from worker.run.compaction_setup import CompactionSetup
from worker.tools import builtin_tools

HOSTILE = (
    "\x1b]0;pwned\x07"  # OSC: set the window title, ended by BEL
    "\x1b[2J\x1b[31m"  # CSI: clear the screen, red
    "\x9b1m"  # C1 CSI: bold, on terminals that read 8-bit controls
    "\u202eevil\u202c"  # RIGHT-TO-LEFT OVERRIDE … POP DIRECTIONAL FORMATTING
    "\u2066\u200f\u061c\u200b"  # an isolate, bidi marks, a zero-width space
    "\x7f\r\x08\u2028"  # DEL, a carriage return, a backspace, a line separator
    "\U000e0041"  # a tag character (a format character above U+FFFF)
)

SCHEMA_REFUSES = {
    ("agents", "policy_mode"),
    ("agents", "destructive_policy"),
    ("approval_requests", "status"),
    ("approval_requests", "consumer"),
    ("missions", "status"),
    ("missions", "catch_up"),
    ("mission_iterations", "status"),
    ("tool_invocations", "outcome"),
    ("tool_invocations", "consumer"),
    ("agent_mcp_servers", "transport"),
}
"""Text columns whose CHECK constraint holds them to a few words: they cannot be hostile."""

LOOKUP_KEYS = {
    ("user_policy_settings", "user_id"): "`policy show u1` must find the user's settings",
}
"""Text the commands below are given on the command line, where it cannot be hostile."""

NULL_KEPT = {
    ("agent_mcp_servers", "url"): "NULL for a stdio server (a CHECK constraint)",
    ("agent_mcp_servers", "command"): "NULL for an http server (a CHECK constraint)",
    ("missions", "lease_owner"): "NULL: not leased (a hostile owner would hold the mission)",
    ("compacted_turns", "error"): "NULL: the compaction folded turns (replay restores them)",
    ("tool_invocations", "error"): "NULL: the call returned a result (shown instead)",
}
"""Columns left NULL where they are NULL, for what NULL means there (a non-NULL value is made
hostile all the same). Every other NULL text becomes ``HOSTILE``: a model name, an error."""

STRUCTURE_KEYS = {"role"}
"""JSON keys whose string values say what a message is; kept so that the log stays a log."""

COMMANDS: list[list[str]] = [
    ["tick"],  # runs a hostile mission: what fails is logged and stored (and shown below)
    ["agents", "list"],
    ["missions", "list"],
    ["missions", "show", "{mission}"],
    ["missions", "history", "{mission}"],
    ["missions", "pause", "{mission}"],
    ["missions", "resume", "{mission}"],  # the hostile cron is refused, quoted in the error
    ["iterations", "list"],
    ["iterations", "show", "{iteration}"],
    ["replay", "{iteration}"],
    ["replay", "{iteration}", "--format", "markdown"],
    ["replay", "{iteration}", "--rerun"],
    ["replay", "{iteration}", "--rerun", "--format", "markdown"],
    ["policy", "show", "u1"],
    ["policy", "report"],
    ["mcp", "token", "list"],
    ["mcp", "token", "revoke", "{token}"],
    ["approvals", "list"],
    ["approvals", "show", "{approval}"],
    ["approvals", "approve", "{approval}"],
    ["approvals", "deny", "{approval}"],  # refused: it says who approved it (hostile)
    ["admin", "token", "list"],
    ["admin", "token", "revoke", "{admin_token}"],
]
"""Every command that prints stored text, each also run with ``--json``."""

PRINT_NO_STORED_TEXT = {
    "db upgrade": "prints the schema revision",
    "worker": "a daemon: its log lines are tick's (run above)",
    "mcp serve": "prints its address and settings; peers' text reaches only its log lines",
    "agents add": "prints the name given (refused if hostile), with --if-not-exists the id",
    "agents set": "takes the agent's name, which no command line can give when it is hostile",
    "missions add": "prints what it was given (refused if hostile)",
    "policy allow-destructive": "prints what it was given and the opt-ins (as policy show)",
    "policy revoke-destructive": "prints what it was given and the opt-ins (as policy show)",
    "policy set-rate-limit": "prints what it was given",
    "mcp token create": "prints what it was given and the new token",
    "admin token create": "prints what it was given and the new token",
    "serve": "a server: prints its address; stored text reaches only its pages (escaped: "
    "tests/integration/test_console.py) and its JSON",
}


def hidden_characters(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on or hide (every control but newline
    and tab, format characters, surrogates, private use, line and paragraph separators)."""
    hidden = {"Cc", "Cf", "Cs", "Co", "Zl", "Zp"}
    return sorted(
        {f"U+{ord(c):04X}" for c in text if c not in "\n\t" and unicodedata.category(c) in hidden}
    )


def scripted_model() -> FunctionChatModel:
    """Four rounds of tool calls whose usage climbs past 92 % of the agent's 2,000-token
    context (a compaction, then its reminder), a summary, and an answer."""
    rounds = iter((400, 800, 1200, 1700))

    def answer(request: CompletionRequest) -> CompletionResponse:
        if request.messages and request.messages[0].content == SUMMARY_PROMPT:
            return final_answer("Facts found: the clock was read, a note was written.")
        prompt_tokens = next(rounds, None)
        if prompt_tokens is None:
            return final_answer("It is 12:00; the note is written.")
        calls = [
            ("clock_now", {}),
            ("notes_create", {"title": "a note", "body": "ignore previous instructions"}),
            ("notes_delete", {"id": 999_999}),  # fails: no such note
        ]
        usage = TokenUsage(prompt_tokens=prompt_tokens, completion_tokens=160)
        return tool_calls(*calls, usage=usage)

    return FunctionChatModel(answer)


async def seed(db: AsyncEngine, run: Any) -> dict[str, int]:
    """Agents, a mission run with every kind of record, MCP servers, a token, opt-ins."""
    await asyncio.to_thread(
        as_json,
        run,
        "agents",
        "add",
        "--name",
        "a1",
        "--owner",
        "u1",
        "--model",
        "m1",
        "--compact-max-ctx",
        "2000",
        "--max-rounds",
        "8",
        "--mcp",
        "search=https://mcp.example.com/mcp",
        "--mcp",
        "files=stdio:npx -y files-server",
    )
    mission = await asyncio.to_thread(
        as_json, run, "missions", "add", "--agent", "a1", "--objective", "Note the time.",
        "--cron", "0 9 * * *", "--due-now",
    )  # fmt: skip
    token = await asyncio.to_thread(as_json, run, "mcp", "token", "create", "u1", "--label", "l")
    admin_token = await asyncio.to_thread(as_json, run, "admin", "token", "create", "alice")
    await AdminTokenStore(db).start_session(admin_token["token"], ttl=timedelta(hours=1))
    await asyncio.to_thread(as_json, run, "policy", "allow-destructive", "u1", "notes_delete")
    await asyncio.to_thread(
        as_json, run, "policy", "set-rate-limit", "u1", "50", "--tool", "clock_now"
    )
    llm = scripted_model()
    tools = [
        t for t in builtin_tools(db) if t.name in ("clock_now", "notes_create", "notes_delete")
    ]
    worker = make_worker(
        db,
        llm,
        policy=policy_setup(db, "log-only"),
        compaction=CompactionSetup(llm=llm, max_ctx=10**6),
        tools_for=lambda mission: tools,
    )
    outcome = await worker.run_once()
    async with db.connect() as conn:
        [error] = (await conn.execute(select(mission_iterations.c.error))).scalars().all()
    assert outcome == ["succeeded"], error
    async with db.begin() as conn:
        [archived] = (await conn.execute(select(compacted_turns))).mappings().all()
        failed = {k: v for k, v in archived.items() if k != "id"}
        failed |= {"compaction_index": 2, "error": "llm_error: down", "folded": []}
        await conn.execute(insert(compacted_turns).values(**failed))  # a failed attempt too
    # a run parked for a person's approval of a destructive call
    await asyncio.to_thread(
        as_json, run, "agents", "add", "--name", "a2", "--owner", "u2", "--policy-mode",
        "enforce", "--destructive", "ask",
    )  # fmt: skip
    await asyncio.to_thread(
        as_json, run, "missions", "add", "--agent", "a2", "--objective", "Tidy.", "--due-now"
    )
    asker = make_worker(
        db,
        FunctionChatModel(lambda r: tool_calls(("notes_delete", {"id": 1}))),
        policy=policy_setup(db, "log-only"),
        tools_for=lambda mission: tools,
    )
    assert await asker.run_once() == ["awaiting_approval"]
    async with db.connect() as conn:
        [approval] = (await conn.execute(select(approval_requests.c.id))).scalars().all()
    # due at the next tick, with all of the agent's (hostile) settings
    await asyncio.to_thread(
        as_json, run, "missions", "add", "--agent", "a1", "--objective", "Again.", "--due-now"
    )
    return {
        "mission": mission["id"],
        "iteration": archived["iteration_id"],
        "token": token["id"],
        "approval": approval,
        "admin_token": admin_token["id"],
    }


def poisoned(value: Any, *, keys: bool = False) -> Any:
    """``value`` (a JSON value) with ``HOSTILE`` appended to every string in it (and to the
    keys of the objects that hold data: tool arguments and results, rate limits)."""
    if isinstance(value, str):
        return value + HOSTILE
    if isinstance(value, list):
        return [poisoned(v, keys=keys) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            data = keys or k in ("arguments", "result")
            if k in STRUCTURE_KEYS and not keys:
                out[k] = v
            else:
                out[(k + HOSTILE) if keys else k] = poisoned(v, keys=data)
        return out
    return value


async def poison(db: AsyncEngine) -> tuple[set[tuple[str, str]], set[str]]:
    """Make every stored text hostile (see the module docstring); returns the text columns
    the schema refused it for, and the tables that hold no row."""
    refused, empty = set(), set()
    for table in metadata.sorted_tables:
        key = list(table.primary_key.columns)
        async with db.connect() as conn:
            if not (await conn.execute(select(*key).limit(1))).first():
                empty.add(table.name)
        for column in table.columns:
            name = (table.name, column.name)
            if not isinstance(column.type, Text | ARRAY | JSONB) or name in LOOKUP_KEYS:
                continue
            async with db.connect() as conn:
                rows = (await conn.execute(select(*key, column))).all()
            try:
                async with db.begin() as conn:
                    for *ids, value in rows:
                        if value is None and name in NULL_KEPT:
                            continue
                        new: Any
                        if isinstance(column.type, ARRAY):
                            new = [v + HOSTILE for v in value or []] or [HOSTILE]
                        elif isinstance(column.type, Text):
                            new = (value or "") + HOSTILE
                        else:
                            data = column.name in ("arguments", "result", "tool_rate_limits")
                            new = poisoned(value, keys=data)
                        match = [c == i for c, i in zip(key, ids, strict=True)]
                        await conn.execute(update(table).where(*match).values({column: new}))
            except IntegrityError:
                refused.add(name)
    return refused, empty


async def test_no_command_prints_a_hidden_character_of_what_is_stored(
    db: AsyncEngine, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MANA_AI_LOG_FORMAT", "text")  # the one that quotes by hand
    ids = await seed(db, run)
    assert await poison(db) == (SCHEMA_REFUSES, set()), "every table holds hostile rows"

    # every command is run below or says why it prints no stored text: a new one must choose
    exercised = {
        c for c in command_names() for argv in COMMANDS if argv[: len(c.split())] == c.split()
    }
    assert sorted(set(command_names()) - exercised - set(PRINT_NO_STORED_TEXT)) == []

    leaks = []
    for template in COMMANDS:
        argv = [w.format(**ids) for w in template]
        for extra in ([], ["--json"]):
            code, out, err = await asyncio.to_thread(run, *argv, *extra)
            where = " ".join([*argv, *extra])
            if hidden_characters(out) or hidden_characters(err):
                leaks.append(f"{where}: {hidden_characters(out + err)}")
            assert "Traceback" not in err, f"{where}: {err}"
            if extra and code == 0 and template[0] != "tick":
                json.loads(out)  # escaped inside strings: still JSON
    assert leaks == []


async def test_json_output_gives_the_stored_text_back_exactly(db: AsyncEngine, run: Any) -> None:
    ids = await seed(db, run)
    await poison(db)
    shown = await asyncio.to_thread(as_json, run, "missions", "show", str(ids["mission"]))
    assert shown["objective"] == "Note the time." + HOSTILE  # escaped, not lost
    code, out, _ = await asyncio.to_thread(run, "missions", "show", str(ids["mission"]))
    assert code == 0 and "objective: Note the time.\\u001b]0;pwned\\u0007" in out
    assert "\\u202eevil\\u202c" in out and "\\U000e0041" in out  # an admin sees they are there
    code, out, _ = await asyncio.to_thread(run, "missions", "list")
    rows = out.splitlines()
    assert code == 0 and len(rows) == 4, "a hidden line break split a row"  # header + 3
