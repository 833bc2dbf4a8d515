"""``mana-ai policy …`` and ``agents add|set --policy-mode`` in-process against the test
database: what they print, store and refuse."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.cli_harness import as_json
from worker.db.tables import mission_iterations, missions, tool_invocations


def test_show_of_a_user_without_settings_gives_the_defaults(run: Any) -> None:
    shown = as_json(run, "policy", "show", "u1")
    assert shown["destructive_opt_ins"] == [] and shown["rate_limit"] is None
    assert shown["default_mode"] == "log-only" and shown["window_s"] == 60
    by_tool = {t["tool"]: t for t in shown["tools"]}
    assert by_tool["notes_delete"]["opted_in"] is False
    assert by_tool["notes_list"]["opted_in"] is None  # not destructive: no opt-in applies
    assert {t["calls_per_window"] for t in shown["tools"]} == {30}
    code, out, _ = run("policy", "show", "u1")
    assert code == 0 and "no settings of their own" in out and "notes_delete" in out


def test_allow_and_revoke_destructive_by_tool_and_by_scope(run: Any) -> None:
    row = as_json(run, "policy", "allow-destructive", "u1", "notes_delete")
    assert row["destructive_opt_ins"] == ["notes_delete"]
    row = as_json(run, "policy", "allow-destructive", "u1", "notes_delete")  # idempotent
    assert row["destructive_opt_ins"] == ["notes_delete"]
    row = as_json(run, "policy", "allow-destructive", "u1", "notes")
    assert row["destructive_opt_ins"] == ["notes_delete", "notes"]
    row = as_json(run, "policy", "revoke-destructive", "u1", "notes_delete")
    assert row["destructive_opt_ins"] == ["notes"]
    by_tool = {t["tool"]: t for t in as_json(run, "policy", "show", "u1")["tools"]}
    assert by_tool["notes_delete"]["opted_in"] is True  # through its scope
    code, out, _ = run("policy", "revoke-destructive", "u1", "notes")
    assert code == 0 and "opt-ins now: (none)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["allow-destructive", "u1", "rm_rf"], "unknown tool or scope 'rm_rf'"),
        (["allow-destructive", "u1", "notes_list"], "notes_list is not destructive"),
        (
            ["revoke-destructive", "u1", "nope"],
            "destructive tools: notes_delete; their scopes: notes",
        ),
        (["allow-destructive", " ", "notes"], "the user id must not be empty"),
        (["allow-destructive", "u1", "clock"], "scope 'clock' has no destructive tools"),
        (["allow-destructive", "eve\nmallory", "notes"], "must not contain control"),
        (["allow-destructive", "x" * 10_000, "notes"], "10000 characters long; at most 200"),
        (["set-rate-limit", "x" * 201, "5"], "201 characters long"),
        (["set-rate-limit", "u1", "5", "--tool", "rm_rf"], "unknown tool 'rm_rf'"),
    ],
)
def test_unknown_tools_and_scopes_are_refused_with_the_known_ones(
    run: Any, argv: list[str], message: str
) -> None:
    code, _, err = run("policy", *argv)
    assert code == 2 and message in err
    assert as_json(run, "policy", "show", "u1")["updated_at"] is None  # nothing written


@pytest.mark.parametrize("calls", ["0", "-3", "lots", "100001"])
def test_set_rate_limit_refuses_nonsense(run: Any, calls: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("policy", "set-rate-limit", "u1", calls)
    assert exit_info.value.code == 2


def test_set_rate_limit_per_user_and_per_tool_and_back_to_default(run: Any) -> None:
    as_json(run, "policy", "set-rate-limit", "u1", "50")
    row = as_json(run, "policy", "set-rate-limit", "u1", "5", "--tool", "notes_create")
    assert row["rate_limit"] == 50 and row["tool_rate_limits"] == {"notes_create": 5}
    by_tool = {t["tool"]: t for t in as_json(run, "policy", "show", "u1")["tools"]}
    assert by_tool["notes_create"]["calls_per_window"] == 5
    assert by_tool["notes_list"]["calls_per_window"] == 50
    row = as_json(run, "policy", "set-rate-limit", "u1", "default", "--tool", "notes_create")
    assert row["tool_rate_limits"] == {}
    row = as_json(run, "policy", "set-rate-limit", "u1", "default")
    assert row["rate_limit"] is None


def test_agents_policy_mode_on_add_and_set(run: Any) -> None:
    agent = as_json(run, "agents", "add", "--name", "a", "--owner", "u", "--policy-mode", "enforce")
    assert agent["policy_mode"] == "enforce"
    agent = as_json(run, "agents", "set", "a", "--policy-mode", "default")
    assert agent["policy_mode"] is None
    agent = as_json(
        run, "agents", "set", "a", "--max-tokens-per-day", "1000", "--tools", "clock_now"
    )
    assert agent["max_tokens_per_day"] == 1000 and agent["allowed_tools"] == ["clock_now"]
    agent = as_json(run, "agents", "set", "a", "--max-tokens-per-day", "none", "--tools", "all")
    assert agent["max_tokens_per_day"] is None and agent["allowed_tools"] is None
    code, _, err = run("agents", "set", "a")
    assert code == 2 and "nothing to change" in err
    code, _, err = run("agents", "set", "ghost", "--max-rounds", "3")
    assert code == 1 and "no agent named 'ghost'" in err
    with pytest.raises(SystemExit):
        run("agents", "set", "a", "--policy-mode", "strict")


@pytest.mark.parametrize("since", ["7", "1w", "-1d", "0s", "99999d", "1.5x"])
def test_report_since_must_be_a_duration(run: Any, since: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("policy", "report", "--since", since)
    assert exit_info.value.code == 2


async def _store_calls(db: AsyncEngine, decisions: list[tuple[str, str, str]]) -> None:
    """Tool invocations with ``(mode, verdict, reason)`` decisions, as the runner stores them."""
    async with db.begin() as conn:
        agent = await conn.exec_driver_sql(
            "INSERT INTO agents (name, owner_user_id, system_prompt) VALUES ('a', 'u1', 's') "
            "RETURNING id"
        )
        mission = await conn.execute(
            insert(missions)
            .values(agent_id=agent.scalar_one(), objective="o")
            .returning(missions.c.id)
        )
        mission_id = mission.scalar_one()
        iteration = await conn.execute(
            insert(mission_iterations)
            .values(
                mission_id=mission_id,
                scheduled_for=datetime.now(UTC),
                status="succeeded",
                worker_id="w",
            )
            .returning(mission_iterations.c.id)
        )
        iteration_id = iteration.scalar_one()
        for n, (mode, verdict, reason) in enumerate(decisions):
            await conn.execute(
                insert(tool_invocations).values(
                    iteration_id=iteration_id,
                    mission_id=mission_id,
                    user_id="u1",
                    round=1,
                    call_id=f"c{n}",
                    tool="notes_delete" if reason != "allowed" else "notes_list",
                    arguments={},
                    outcome="ok" if mode == "log-only" or verdict == "allow" else "denied",
                    policy_mode=mode,
                    policy_decision={
                        "allow": mode == "log-only" or verdict == "allow",
                        "verdict": verdict,
                        "reason": reason,
                        "mode": mode,
                        "flags": ["injection_marker"] if n == 0 else [],
                    },
                )
            )


async def test_report_shows_the_would_be_deny_share_of_log_only(db: AsyncEngine, run: Any) -> None:
    await _store_calls(
        db,
        [("log-only", "allow", "allowed")] * 98
        + [("log-only", "deny", "destructive_not_opted_in")] * 2
        + [("enforce", "deny", "rate_limited")],
    )
    # the CLI runs its own event loop: call it from a thread, as a separate process would
    report = await asyncio.to_thread(as_json, run, "policy", "report", "--since", "7d")
    assert report["by_mode"]["log-only"] == {
        "calls": 100,
        "allowed": 98,
        "denied": 2,
        "asked": 0,
        "flagged": 1,
    }
    assert report["by_mode"]["enforce"]["denied"] == 1
    assert report["would_deny_share"] == 0.02
    code, out, _ = await asyncio.to_thread(run, "policy", "report")
    assert code == 0
    assert "enforce would have denied 2 of 100 calls (2.00%)" in out
    assert "at or above the 1 % switch criterion" in out
    assert "destructive_not_opted_in" in out


def test_report_with_nothing_to_report(run: Any) -> None:
    code, out, _ = run("policy", "report", "--since", "1h")
    assert code == 0 and "no decisions" in out
    assert as_json(run, "policy", "report")["would_deny_share"] is None


async def test_iterations_show_prints_each_calls_decision(db: AsyncEngine, run: Any) -> None:
    await _store_calls(
        db,
        [
            ("enforce", "allow", "allowed"),
            ("log-only", "deny", "destructive_not_opted_in"),
            ("enforce", "deny", "rate_limited"),
        ],
    )
    code, out, _ = await asyncio.to_thread(run, "iterations", "show", "latest")
    assert code == 0
    assert "policy: allowed (enforce); flagged: injection_marker" in out
    assert "policy: would deny: destructive_not_opted_in (log-only)" in out
    assert "policy: denied: rate_limited (enforce)" in out


def test_bad_names_are_refused_before_the_database_is_opened(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MANA_AI_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    code, _, err = run("policy", "allow-destructive", "alice", "nope")
    assert code == 2 and "unknown tool or scope 'nope'" in err


def test_revoke_says_what_still_allows_the_tool_and_writes_nothing_when_nothing_to_revoke(
    run: Any,
) -> None:
    code, out, _ = run("policy", "revoke-destructive", "bob", "notes_delete")
    assert code == 0 and "bob had not opted in to notes_delete; nothing changed" in out
    assert as_json(run, "policy", "show", "bob")["updated_at"] is None  # no row written
    as_json(run, "policy", "allow-destructive", "bob", "notes")
    as_json(run, "policy", "allow-destructive", "bob", "notes_delete")
    code, out, _ = run("policy", "revoke-destructive", "bob", "notes_delete")
    assert code == 0 and "stays allowed through its scope notes" in out


def test_a_setting_for_a_user_without_agents_is_kept_with_a_note(run: Any) -> None:
    code, _, err = run("policy", "set-rate-limit", "typo-user", "5")
    assert code == 0 and "no agent is owned by user 'typo-user'" in err
    as_json(run, "agents", "add", "--name", "a", "--owner", "alice")
    code, _, err = run("policy", "set-rate-limit", "alice", "5")
    assert code == 0 and "no agent" not in err


def test_show_says_where_each_limit_comes_from(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_POLICY_TOOL_RATE_LIMITS", "notes_delete=2")
    monkeypatch.setenv("MANA_AI_POLICY_MISSION_SCOPES", "notes")
    as_json(run, "policy", "set-rate-limit", "carol", "100")
    as_json(run, "policy", "set-rate-limit", "carol", "7", "--tool", "notes_create")
    shown = as_json(run, "policy", "show", "carol")
    by_tool = {t["tool"]: t for t in shown["tools"]}
    # the most specific setting wins: user+tool, then the operator's per-tool limit, then user
    assert (by_tool["notes_create"]["calls_per_window"], by_tool["notes_create"]["limit_from"]) == (
        7,
        "user+tool",
    )
    assert (by_tool["notes_delete"]["calls_per_window"], by_tool["notes_delete"]["limit_from"]) == (
        2,
        "tool",
    )
    assert (by_tool["notes_list"]["calls_per_window"], by_tool["notes_list"]["limit_from"]) == (
        100,
        "user",
    )
    assert shown["mission_scopes"] == ["notes"]
    assert by_tool["clock_now"]["exposed_to_missions"] is False
    code, out, _ = run("policy", "show", "carol")
    assert code == 0 and "scopes missions may use: notes" in out and "2 (tool)" in out


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "MANA_AI_POLICY_MISSION_SCOPES",
            "clocks",
            "unknown scope(s) clocks; known: clock, notes, web",
        ),
        ("MANA_AI_POLICY_TOOL_RATE_LIMITS", "notes_creat=1", "unknown tool(s) notes_creat"),
    ],
)
def test_policy_settings_naming_unknown_tools_or_scopes_stop_the_tick(
    run: Any, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    code, _, err = run("tick", "--once")
    assert code == 2 and message in err


def test_policy_mode_is_case_insensitive_on_the_command_line_too(run: Any) -> None:
    agent = as_json(run, "agents", "add", "--name", "a", "--owner", "u", "--policy-mode", "Enforce")
    assert agent["policy_mode"] == "enforce"
    code, out, _ = run("agents", "set", "a", "--policy-mode", "DEFAULT")
    assert code == 0 and "changed: policy_mode default" in out
    code, out, _ = run("agents", "list")
    assert "default (log-only)" in out


def test_report_since_overflow_is_a_usage_error(run: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("policy", "report", "--since", "99999999999999999999d")
    assert exit_info.value.code == 2
