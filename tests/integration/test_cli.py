"""The ``mana-ai`` admin commands in-process against the test database: what they print,
their exit status, and that bad input writes nothing."""

from __future__ import annotations

import io
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_harness import as_json


def test_agents_add_and_list(run: Any) -> None:
    agent = as_json(
        run,
        "agents",
        "add",
        "--name",
        "scout",
        "--owner",
        "u1",
        "--tools",
        "clock_now,notes_list",
        "--max-rounds",
        "3",
    )
    assert agent["allowed_tools"] == ["clock_now", "notes_list"] and agent["max_rounds"] == 3
    code, _, err = run("agents", "add", "--name", "scout", "--owner", "u1")
    assert code == 1 and "an agent named 'scout' already exists" in err
    again = as_json(run, "agents", "add", "--name", "scout", "--owner", "u1", "--if-not-exists")
    assert again["id"] == agent["id"]
    assert [a["name"] for a in as_json(run, "agents", "list")] == ["scout"]
    code, out, _ = run("agents", "list")
    assert code == 0 and "scout" in out and "NAME" in out


def test_agents_add_refuses_unknown_tools_and_writes_nothing(run: Any) -> None:
    code, _, err = run("agents", "add", "--name", "x", "--owner", "u", "--tools", "clock_now,rm_rf")
    assert code == 2 and "unknown tool(s) rm_rf" in err and "notes_list" in err
    assert as_json(run, "agents", "list") == []


def test_missions_lifecycle_add_show_pause_resume(run: Any) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    mission = as_json(
        run,
        "missions",
        "add",
        "--agent",
        "a",
        "--objective",
        "Daily digest",
        "--cron",
        "30 7 * * 1-5",
        "--timezone",
        "Europe/Berlin",
    )
    assert mission["status"] == "active" and mission["timezone"] == "Europe/Berlin"
    shown = as_json(run, "missions", "show", str(mission["id"]))
    assert shown["agent"] == "a" and shown["iterations"] == 0
    assert as_json(run, "missions", "pause", str(mission["id"]))["status"] == "paused"
    assert [m["id"] for m in as_json(run, "missions", "list", "--status", "paused")] == [
        mission["id"]
    ]
    resumed = as_json(run, "missions", "resume", str(mission["id"]))
    assert resumed["status"] == "active"
    code, _, err = run("missions", "show", "999")
    assert code == 1 and "no mission with id 999" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 9 * *"], "expected 5 fields"),
        ([], "give --cron for a recurring mission"),
        (["--cron", "0 9 * * *", "--at", "2030-01-01T00:00+00:00"], "--at is for one-shot"),
        (
            ["--at", "2030-01-01T00:00+00:00", "--deadline", "2029-01-01T00:00+00:00"],
            "is before the first run",
        ),
        # a time zone means nothing to a one-shot run: it was taken and ignored
        (["--due-now", "--timezone", "Europe/Berlin"], "--timezone is the time zone of --cron"),
        (["--at", "2030-01-01T00:00+00:00", "--timezone", "UTC"], "--timezone is the time"),
        (["--due-now", "--catch-up", "all"], "--catch-up all runs each missed run of a --cron"),
        (["--cron", "0 9 * * *", "--catch-up-window", "6h"], "give it with that policy only"),
    ],
)
def test_missions_add_bad_input_writes_nothing(run: Any, args: list[str], message: str) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    code, _, err = run("missions", "add", "--agent", "a", "--objective", "x", *args)
    # 1: the values were refused (a cron that does not parse); 2: the command line is wrong
    assert code == (1 if "fields" in message else 2) and message in err
    assert as_json(run, "missions", "list") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--catch-up", "all", "--catch-up-window", "31d"], "expected a window from 1m to 30d"),
        (["--catch-up", "all", "--catch-up-window", "0s"], "expected a duration above 0"),
        (["--catch-up", "sometimes"], "invalid choice: 'sometimes'"),
    ],
)
def test_missions_add_refuses_catch_up_values_it_cannot_take(
    run: Any, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    with pytest.raises(SystemExit) as exited:
        run("missions", "add", "--agent", "a", "--objective", "x", "--cron", "0 9 * * *", *args)
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert as_json(run, "missions", "list") == []


def test_missions_add_keeps_the_catch_up_policy_and_shows_it(run: Any) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    plain = as_json(
        run, "missions", "add", "--agent", "a", "--objective", "x", "--cron", "0 9 * * *"
    )
    assert (plain["catch_up"], plain["catch_up_window"]) == ("once", None)
    made = as_json(
        run,
        "missions",
        "add",
        "--agent",
        "a",
        "--objective",
        "x",
        "--cron",
        "0 9 * * *",
        "--catch-up",
        "all",
        "--catch-up-window",
        "6h",
    )
    shown = as_json(run, "missions", "show", str(made["id"]))
    assert (shown["catch_up"], shown["catch_up_window"]) == ("all", "PT6H")
    code, out, _ = run("missions", "show", str(made["id"]))
    assert code == 0 and "catch_up: all" in out


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 9 * * monkey", "day-of-week 'monkey' in 'monkey' is not a number or a name"),
        ("0 9 * * monday", "day-of-week 'monday'"),
        ("0 9 L * *", "day-of-month 'L'"),
    ],
)
def test_missions_add_refuses_what_is_not_cron_with_exit_1(
    run: Any, cron: str, message: str
) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    code, _, err = run("missions", "add", "--agent", "a", "--objective", "x", "--cron", cron)
    assert code == 1 and f"invalid cron expression {cron!r}" in err and message in err
    assert as_json(run, "missions", "list") == []


def test_naive_times_are_a_usage_error(run: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("missions", "add", "--agent", "a", "--objective", "x", "--at", "2030-01-01T00:00")
    assert exit_info.value.code == 2


def test_iterations_list_and_show_latest_when_empty(run: Any) -> None:
    assert as_json(run, "iterations", "list") == []
    code, _, err = run("iterations", "show", "latest")
    assert code == 1 and "no iterations stored yet" in err


def test_invalid_settings_exit_2_naming_the_variable(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", "-1")
    code, _, err = run("agents", "list")
    assert code == 2 and "MANA_AI_TICK_INTERVAL_S" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", " ", "--owner", "u"], "--name must not be empty"),
        (["--name", "a", "--owner", ""], "--owner must not be empty"),
        (["--name", "a\nb", "--owner", "u"], "--name must not contain control"),
        (["--name", "a", "--owner", "u" * 201], "--owner is 201 characters long; at most 200"),
        (["--name", "a\u200bb", "--owner", "u"], "--name must not contain control or invisible"),
        (["--name", "a", "--owner", "u", "--tools", ","], "--tools names no tool"),
    ],
)
def test_agents_add_refuses_blank_values(run: Any, args: list[str], message: str) -> None:
    code, _, err = run("agents", "add", *args)
    assert code == 2 and message in err
    assert as_json(run, "agents", "list") == []


def test_agents_add_stores_each_tool_once(run: Any) -> None:
    agent = as_json(
        run,
        "agents",
        "add",
        "--name",
        "a",
        "--owner",
        "u",
        "--tools",
        "clock_now, clock_now ,notes_read",
    )
    assert agent["allowed_tools"] == ["clock_now", "notes_read"]


def test_resume_of_an_active_mission_keeps_its_next_run(run: Any) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    mission = as_json(
        run,
        "missions",
        "add",
        "--agent",
        "a",
        "--objective",
        "x",
        "--cron",
        "0 9 * * *",
        "--due-now",
    )
    resumed = as_json(run, "missions", "resume", str(mission["id"]))
    assert resumed["next_run_at"] == mission["next_run_at"]
    assert resumed["status"] == "active"


def test_resume_after_the_deadline_says_no_run_will_start(run: Any) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    deadline = datetime.now(UTC) + timedelta(seconds=1)
    mission = as_json(
        run, "missions", "add", "--agent", "a", "--objective", "x", "--cron", "0 9 * * *",
        "--due-now", "--deadline", deadline.isoformat(),
    )  # fmt: skip
    assert run("missions", "pause", str(mission["id"]))[0] == 0
    time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.05)
    code, out, _ = run("missions", "resume", str(mission["id"]))
    assert code == 0 and "deadline" in out and "completes it without a run" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "2020-01-01T09:00+00:00"], "is in the past; use --due-now"),
        (["--at", "2999-01-01T09:00+00:00", "--due-now"], "either --at or --due-now"),
    ],
)
def test_one_shot_times_that_would_surprise_are_refused(
    run: Any, args: list[str], message: str
) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    code, _, err = run("missions", "add", "--agent", "a", "--objective", "x", *args)
    assert code == 2 and message in err
    assert as_json(run, "missions", "list") == []


def test_ids_beyond_bigint_are_a_usage_error(run: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("missions", "show", "99999999999999999999")
    assert exit_info.value.code == 2


def test_limits_beyond_the_cap_are_a_usage_error(run: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run("missions", "list", "--limit", "99999999999999999999")
    assert exit_info.value.code == 2


def status_of(run: Any, *argv: str) -> tuple[int, str, str]:
    """``run`` that also returns argparse's exit status (it raises SystemExit)."""
    try:
        return run(*argv)
    except SystemExit as exc:
        return int(exc.code or 0), "", ""


# -- names and text: one rule, every command ------------------------------------------------------


@pytest.mark.parametrize("given", ["  padded  ", "\tpadded\n"])
def test_missions_add_finds_an_agent_by_its_trimmed_name(run: Any, given: str) -> None:
    as_json(run, "agents", "add", "--name", given, "--owner", "u")
    mission = as_json(run, "missions", "add", "--agent", given, "--objective", "  x  ", "--due-now")
    assert mission["objective"] == "x"
    assert [a["name"] for a in as_json(run, "agents", "list")] == ["padded"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["agents", "add", "--name", "a", "--owner", "u", "--model", "gpt\n4"], "--model must not"),
        (
            ["agents", "add", "--name", "a", "--owner", "u", "--system-prompt", " "],
            "--system-prompt",
        ),
        (
            [
                "missions",
                "add",
                "--agent",
                "a",
                "--objective",
                "x",
                "--due-now",
                "--timezone",
                "Z" * 10_000,
            ],
            "--timezone is 10000 characters long",  # was an OSError reported as a database error
        ),
        (["missions", "add", "--agent", "a", "--objective", "a\x1bb", "--due-now"], "--objective"),
        (
            ["missions", "add", "--agent", "a", "--objective", "Pay\n\u202e01$", "--due-now"],
            "--objective must not contain bidi embeddings, overrides or isolates (U+202E "
            "RIGHT-TO-LEFT OVERRIDE at line 2, column 1)",
        ),
        (
            ["agents", "add", "--name", "a", "--owner", "u", "--system-prompt", "Be \u2067x"],
            "--system-prompt must not contain bidi embeddings, overrides or isolates (U+2067",
        ),
        (
            ["agents", "set", "a", "--system-prompt", "Be\tbrief\x1b[8m hidden"],
            "--system-prompt must not contain control characters other than newline and tab "
            "(U+001B ESC at line 1, column 9)",
        ),
        (["policy", "allow-destructive", "u", "notes\u200b_delete"], "TOOL_OR_SCOPE must not"),
        (["policy", "set-rate-limit", "u", "5", "--tool", "x" * 300], "--tool is 300 characters"),
    ],
)
def test_every_name_and_text_follows_the_rule(run: Any, argv: list[str], message: str) -> None:
    code, _, err = run(*argv)
    assert code == 2 and message in err, err
    assert as_json(run, "agents", "list") == []


def test_missions_list_cuts_long_objectives_like_other_columns(run: Any) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    objective = "Summarise\nthe notes " + "and more " * 100
    as_json(run, "missions", "add", "--agent", "a", "--objective", objective, "--due-now")
    code, out, _ = run("missions", "list")
    row = out.splitlines()[1]
    cell = row[row.index("Summarise") :]
    # one line per row: the newline shows as \n, and the cell is cut at 60 characters
    assert code == 0 and len(cell) == 60 and cell.endswith(" and more an…")
    assert cell.startswith("Summarise\\nthe notes and more") and len(out.splitlines()) == 2
    assert max(len(line) for line in out.splitlines()) < 200
    assert as_json(run, "missions", "show", "1")["objective"] == objective.strip()


def test_objective_file_reads_long_objectives_from_a_file_or_stdin(
    run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    long_text = "\ufeffStep 1: read.\r\n\tStep 2: " + "write " * 3000 + "\n"
    path = tmp_path / "objective.txt"
    path.write_text(long_text, encoding="utf-8")
    from_file = as_json(
        run, "missions", "add", "--agent", "a", "--objective-file", str(path), "--due-now"
    )
    assert from_file["objective"] == long_text.lstrip("\ufeff").replace("\r\n", "\n").strip()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"From stdin.\n")))
    from_stdin = as_json(
        run, "missions", "add", "--agent", "a", "--objective-file", "-", "--due-now"
    )
    assert from_stdin["objective"] == "From stdin."


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (("x" * 20_001).encode(), "--objective-file is 20,001 characters long; at most 20,000"),
        (("é" * 40_001).encode(), "is too long; an objective holds at most 20,000 characters"),
        (b"nul \x00 here", "is not UTF-8 text (a NUL byte at byte 5: a binary file?)"),
        (b"latin-1 \xe9t\xe9", "is not UTF-8 text (byte 9)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not UTF-8 text (a NUL byte at byte 9"),
        (b"\x89PNG\r\n\x1a\n", "is not UTF-8 text (byte 1)"),  # a small binary file
        (Path("/bin/ls").read_bytes(), "is not UTF-8 text"),  # said "too long"
        (b"step 1\nrun \x1b[2J now", "(U+001B ESC at line 2, column 5)"),
        ("step 1\nok \u202egnp.exe".encode(), "--objective-file must not contain bidi"),
        (None, "cannot read"),
    ],
)
def test_objective_file_refusals_write_nothing(
    run: Any, tmp_path: Path, content: bytes | None, message: str
) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    path = tmp_path / "objective.txt"
    if content is not None:
        path.write_bytes(content)
    code, _, err = run(
        "missions", "add", "--agent", "a", "--objective-file", str(path), "--due-now"
    )
    assert code == 2 and message in err, err
    assert as_json(run, "missions", "list") == []


def test_objective_and_objective_file_exclude_each_other(run: Any) -> None:
    code, _, _ = status_of(
        run, "missions", "add", "--agent", "a", "--objective", "x", "--objective-file", "-"
    )
    assert code == 2


# -- numbers: checked where they are parsed -----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (
            ["agents", "add", "--name", "a", "--owner", "u", "--max-rounds", "100000000000"],
            "--max-rounds",
        ),
        (
            ["agents", "add", "--name", "a", "--owner", "u", "--max-tokens-per-day", "3000000000"],
            "--max-tokens-per-day",
        ),
    ],
)
def test_numbers_beyond_what_the_database_holds_are_usage_errors(
    run: Any, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    # it reached PostgreSQL and came back as "value out of int32 range"
    code, _, _ = status_of(run, *argv)
    assert code == 2 and f"argument {flag}: expected at most" in capsys.readouterr().err
    assert as_json(run, "agents", "list") == []


# -- consistency -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "argv"),
    [
        ({"MANA_AI_TICK_INTERVAL_S": "0", "MANA_AI_LEASE_S": "abc"}, ["agents", "list"]),
        (
            {"MANA_AI_POLICY_MISSION_SCOPES": "nope", "MANA_AI_POLICY_TOOL_RATE_LIMITS": "rm=1"},
            ["tick", "--once"],
        ),
    ],
)
def test_the_settings_error_header_is_printed_once(
    run: Any, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], argv: list[str]
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(*argv)
    lines = err.splitlines()
    assert code == 2 and out == ""
    assert err.count("invalid settings") == 1 and lines[0] == "mana-ai: invalid settings:"
    assert sorted(line.split(":")[0].strip() for line in lines[1:]) == sorted(variables)


def test_pausing_a_paused_mission_says_so_like_resume_does(run: Any) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    as_json(run, "missions", "add", "--agent", "a", "--objective", "x", "--cron", "0 9 * * *")
    assert run("missions", "pause", "1")[1] == "mission 1 paused\n"
    paused = as_json(run, "missions", "show", "1")
    assert run("missions", "pause", "1")[:2] == (0, "mission 1 is already paused (unchanged)\n")
    assert as_json(run, "missions", "show", "1")["updated_at"] == paused["updated_at"]
    assert run("missions", "resume", "1")[1].startswith("mission 1 resumed")
    assert run("missions", "resume", "1")[1].startswith("mission 1 is already active")


def test_iterations_of_a_mission_that_does_not_exist_are_an_error(run: Any) -> None:
    code, out, err = run("iterations", "list", "--mission", "999")
    assert (code, out) == (1, "") and "no mission with id 999" in err
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    as_json(run, "missions", "add", "--agent", "a", "--objective", "x", "--cron", "0 9 * * *")
    assert run("iterations", "list", "--mission", "1")[:2] == (0, "(none)\n")


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 12 31 4,6 *"])
def test_a_cron_that_never_fires_is_a_refused_value(run: Any, cron: str) -> None:
    as_json(run, "agents", "add", "--name", "a", "--owner", "u")
    code, _, err = run("missions", "add", "--agent", "a", "--objective", "x", "--cron", cron)
    assert code == 1 and f"cron expression {cron!r} never fires" in err
    assert as_json(run, "missions", "list") == []
