"""``mana-ai mcp token …``, ``agents add|set --mcp …`` and the policy commands' MCP names,
in-process against the test database: what they print, store and refuse, and that no secret
is ever printed back (but a new token, once)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import select

from tests.integration.cli_harness import as_json
from worker.db.engine import create_engine
from worker.db.tables import agent_mcp_servers, mcp_tokens, tool_invocations
from worker.queries.mcp_tokens import hash_token


def rows(database_url: str, table: Any) -> list[dict[str, Any]]:
    """``table``'s rows, read on an engine of its own (these tests are synchronous: the
    command runs its own event loop)."""

    async def read() -> list[dict[str, Any]]:
        engine = create_engine(database_url)
        try:
            async with engine.connect() as conn:
                return [dict(r) for r in (await conn.execute(select(table))).mappings()]
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_a_token_is_printed_once_and_only_its_hash_is_stored(run: Any, database_url: str) -> None:
    code, out, err = run("mcp", "token", "create", "alice", "--label", "laptop")
    assert code == 0
    token = out.splitlines()[1]
    assert token.startswith("mana_mcp_") and len(token) > 40
    assert "only its hash is stored" in out and "no agent is owned by user 'alice'" in err
    [stored] = rows(database_url, mcp_tokens)
    assert stored["token_hash"] == hash_token(token) and token not in str(stored)

    listed = as_json(run, "mcp", "token", "list", "alice")
    assert [(t["id"], t["user_id"], t["label"]) for t in listed] == [(1, "alice", "laptop")]
    assert "token" not in listed[0] and "token_hash" not in listed[0]
    code, out, _ = run("mcp", "token", "list")
    assert code == 0 and "laptop" in out and token not in out

    created = as_json(run, "mcp", "token", "create", "bob")
    assert created["token"].startswith("mana_mcp_") and created["token"] != token


def test_revoking_a_token(run: Any, database_url: str) -> None:
    as_json(run, "mcp", "token", "create", "alice")
    code, out, _ = run("mcp", "token", "revoke", "1")
    assert code == 0 and out.strip() == "MCP token 1 of user alice revoked"
    code, out, _ = run("mcp", "token", "revoke", "1")
    assert code == 0 and "already revoked" in out
    [stored] = rows(database_url, mcp_tokens)
    assert stored["revoked_at"] is not None
    code, _, err = run("mcp", "token", "revoke", "99")
    assert code == 1 and "no MCP token with id 99" in err


def test_an_agent_gets_mcp_servers_and_no_secret_is_printed_back(
    run: Any, database_url: str
) -> None:
    code, out, err = run(
        "agents",
        "add",
        "--name",
        "r",
        "--owner",
        "alice",
        "--mcp",
        "fs=stdio:npx -y @mcp/server-filesystem '/srv/my files'",
        "--mcp-env",
        "fs=API_TOKEN=env-secret-1",
        "--mcp",
        "search=https://bot:url-secret-2@search.example/mcp?key=url-secret-3",
        "--mcp-header",
        "search=Authorization: Bearer header-secret-4",
        "--mcp-required",
        "search",
    )
    assert code == 0, err
    assert out.strip() == (
        "agent r created (id 1); MCP servers: fs (stdio: npx), "
        "search (http: https://bot:***@search.example/mcp?key=***, required)"
    )
    stored = {r["name"]: r for r in rows(database_url, agent_mcp_servers)}
    assert stored["fs"]["args"] == ["-y", "@mcp/server-filesystem", "/srv/my files"]
    assert stored["fs"]["env"] == {"API_TOKEN": "env-secret-1"}
    assert stored["search"]["headers"] == {"Authorization": "Bearer header-secret-4"}
    assert stored["search"]["required"] is True and stored["fs"]["required"] is False

    printed = "".join(run("agents", "list")[1:]) + json.dumps(as_json(run, "agents", "list"))
    for secret in ("env-secret-1", "url-secret-2", "url-secret-3", "header-secret-4"):
        assert secret not in printed + out + err
    [agent] = as_json(run, "agents", "list")
    assert [s["name"] for s in agent["mcp_servers"]] == ["fs", "search"]
    assert agent["mcp_servers"][0]["env"] == ["API_TOKEN"]
    assert agent["mcp_servers"][1]["headers"] == ["Authorization"]


def test_a_stdio_command_may_be_given_unquoted(run: Any, database_url: str) -> None:
    code, _, err = run(
        "agents", "add", "--name", "r", "--owner", "u", "--mcp", "fs=stdio:python", "srv.py", "/d"
    )
    assert code == 0, err
    [stored] = rows(database_url, agent_mcp_servers)
    assert (stored["command"], stored["args"]) == ("python", ["srv.py", "/d"])


def test_the_report_counts_mcp_clients_calls_apart(run: Any, database_url: str) -> None:
    async def insert_calls() -> None:
        engine = create_engine(database_url)
        try:
            async with engine.begin() as conn:
                for consumer, verdict in (("mcp", "deny"), ("mcp", "allow")):
                    await conn.execute(
                        tool_invocations.insert().values(
                            user_id="u",
                            call_id="c",
                            tool="notes_delete",
                            arguments={},
                            outcome="ok",
                            consumer=consumer,
                            policy_mode="log-only",
                            policy_decision={"verdict": verdict, "reason": "x", "flags": []},
                        )
                    )
        finally:
            await engine.dispose()

    asyncio.run(insert_calls())
    report = as_json(run, "policy", "report")
    assert report["by_consumer"] == [
        {"consumer": "mcp", "mode": "log-only", "calls": 2, "allowed": 1, "denied": 1, "flagged": 0}
    ]
    code, out, _ = run("policy", "report")
    assert code == 0 and "by consumer" in out
    assert "mcp      log-only         2 calls      1 denied      0 flagged" in out


def test_agents_set_replaces_and_removes_mcp_servers(run: Any, database_url: str) -> None:
    as_json(run, "agents", "add", "--name", "r", "--owner", "u", "--mcp", "a=http://h/mcp")
    agent = as_json(
        run, "agents", "set", "r", "--mcp", "a=stdio:srv --x", "--mcp", "b=https://b/mcp"
    )
    assert [(s["name"], s["transport"]) for s in agent["mcp_servers"]] == [
        ("a", "stdio"),
        ("b", "http"),
    ]
    code, out, _ = run("agents", "set", "r", "--mcp-remove", "a")
    assert code == 0 and out.strip() == "agent r changed: MCP servers now b (http: https://b/mcp)"
    code, _, err = run("agents", "set", "r", "--mcp-remove", "b", "--mcp-remove", "zz")
    assert code == 1 and "agent r has no MCP server named zz; nothing was changed" in err
    assert [r["name"] for r in rows(database_url, agent_mcp_servers)] == ["b"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mcp", "fs=ftp://x"], "--mcp: MCP server fs: expected an http(s) URL"),
        (["--mcp", "a__b=http://x/mcp"], "--mcp: MCP server name 'a__b'"),
        (["--mcp", "a=http://x", "--mcp", "a=http://y"], "server a is given twice"),
        (["--mcp-header", "s=X-Key: hunter2"], "--mcp-header names server s, which"),
        (
            ["--mcp", "fs=stdio:srv", "--mcp-header", "fs=X-Key: hunter2"],
            "--mcp-header is for http servers; fs takes --mcp-env",
        ),
        (
            ["--mcp", "s=http://x/mcp", "--mcp-env", "s=KEY=hunter2"],
            "--mcp-env is for stdio servers; s takes --mcp-header",
        ),
        (["--mcp", "s=http://x/mcp", "--mcp-header", "s=Bad Name: hunter2"], "not an HTTP"),
        (["--mcp-required", "nope"], "--mcp-required names server nope"),
    ],
)
def test_bad_mcp_options_are_usage_errors_that_echo_no_secret(
    run: Any, database_url: str, argv: list[str], message: str
) -> None:
    code, out, err = run("agents", "add", "--name", "r", "--owner", "u", *argv)
    assert code == 2 and message in err, err
    assert "hunter2" not in out + err
    assert rows(database_url, agent_mcp_servers) == []


def test_policy_commands_take_mcp_scopes_and_tools(run: Any) -> None:
    row = as_json(run, "policy", "allow-destructive", "u", "mcp:fs")
    assert row["destructive_opt_ins"] == ["mcp:fs"]
    row = as_json(run, "policy", "allow-destructive", "u", "fs__delete_file")
    assert row["destructive_opt_ins"] == ["mcp:fs", "fs__delete_file"]
    code, out, _ = run("policy", "revoke-destructive", "u", "fs__delete_file")
    assert code == 0 and "stays allowed through its scope mcp:fs" in out
    row = as_json(run, "policy", "set-rate-limit", "u", "5", "--tool", "fs__read_file")
    assert row["tool_rate_limits"] == {"fs__read_file": 5}
    code, _, err = run("policy", "allow-destructive", "u", "mcp:a__b")
    assert code == 2 and "or an MCP server's scope mcp:NAME or tool NAME__tool" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--user", "alice"], "--user goes with --stdio"),
        (["--stdio"], "--stdio needs --user USER"),
    ],
)
def test_serve_options_that_do_not_fit_are_usage_errors(
    run: Any, argv: list[str], message: str
) -> None:
    code, _, err = run("mcp", "serve", *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MANA_AI_MCP_SCOPES", "notes,mcp:fs", "MANA_AI_MCP_SCOPES: unknown scope(s) mcp:fs"),
        ("MANA_AI_POLICY_MISSION_SCOPES", "mcp:a__b", "unknown scope(s) mcp:a__b"),
    ],
)
def test_mcp_scope_settings_are_checked(
    run: Any, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    code, _, err = run("mcp", "serve")
    assert code == 2 and message in err


def test_missions_may_be_limited_to_an_mcp_servers_scope(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.daemon.tools_setup import check_policy_settings
    from worker.settings import load_settings
    from worker.tools import builtin_tool_catalog

    monkeypatch.setenv("MANA_AI_POLICY_MISSION_SCOPES", "notes,mcp:fs")
    monkeypatch.setenv("MANA_AI_POLICY_TOOL_RATE_LIMITS", "fs__read_file=3")
    check_policy_settings(load_settings(), builtin_tool_catalog())  # no SettingsError
