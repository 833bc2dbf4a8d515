"""``mana-ai missions``: a mission is an agent, an objective and a schedule."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.cli.args import (
    MAX_TEXT_CHARS,
    UsageError,
    aware_datetime,
    catch_up_window,
    checked_text,
    group,
    json_flag,
    limit,
    row_id,
)
from worker.cli.output import emit, fields, fmt, print_json, table
from worker.cli.stores import admin_store, read_only
from worker.terminal_text import visible_line

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``missions add|list|show|history|pause|resume``."""
    ms = group(commands, "missions", "Missions: an agent, an objective, a schedule.")
    _register_add(ms)
    _register_list(ms)
    _register_by_id(ms)


def _register_add(ms: Any) -> None:
    """``missions add``."""
    add = ms.add_parser(
        "add",
        help="Create a mission.",
        description="Create a mission. Give --cron for a recurring mission (5-field cron, "
        "evaluated in --timezone), or --at / --due-now alone for a one-shot mission.",
    )
    add.add_argument("--agent", required=True, help="agent name")
    objective = add.add_mutually_exclusive_group(required=True)
    objective.add_argument(
        "--objective",
        help=f"what the agent should do each run (at most {MAX_TEXT_CHARS:,} characters)",
    )
    objective.add_argument(
        "--objective-file",
        metavar="PATH",
        help="read the objective from a UTF-8 text file ('-': standard input), for long texts",
    )
    add.add_argument("--cron", help="5-field cron expression, e.g. '0 9 * * 1-5'")
    add.add_argument("--timezone", help="IANA timezone of --cron (default UTC)")
    add.add_argument("--at", type=aware_datetime, help="one-shot run time, ISO 8601 with offset")
    add.add_argument(
        "--due-now",
        action="store_true",
        help="first run now (workers start it at once) instead of per --cron",
    )
    add.add_argument(
        "--deadline", type=aware_datetime, help="no runs after this time (ISO 8601 with offset)"
    )
    add.add_argument(
        "--catch-up",
        choices=["skip", "once", "all"],
        default="once",
        help="runs missed while no worker could start them (more than a minute late): skip "
        "them; run once now for all of them (default); or run each one missed within "
        "--catch-up-window, oldest first, while the agent's daily token budget has room",
    )
    add.add_argument(
        "--catch-up-window",
        type=catch_up_window,
        metavar="DURATION",
        help="with --catch-up all: how far back missed runs still run, e.g. 6h, 2d "
        "(1m to 30d; default 1d)",
    )
    json_flag(add)
    add.set_defaults(command_fn=_add)


def _register_list(ms: Any) -> None:
    """``missions list``."""
    lst = ms.add_parser("list", help="List missions.", description="List missions, newest first.")
    lst.add_argument(
        "--status",
        choices=["active", "paused", "completed"],
        help="only missions in this status (an active mission whose run waits for a person's "
        "approval shows 'active, awaiting approval ID')",
    )
    lst.add_argument("--limit", type=limit, default=100, help="rows at most (100)")
    json_flag(lst)
    lst.set_defaults(command_fn=_list)


def _register_by_id(ms: Any) -> None:
    """``missions show|pause|resume|history``: the commands about one mission."""
    for name, helptext, fn in (
        ("show", "Show one mission.", _show),
        ("pause", "Pause a mission (a running iteration finishes).", _pause),
        ("resume", "Resume a paused mission at its next cron time.", _resume),
    ):
        cmd = ms.add_parser(name, help=helptext, description=helptext)
        cmd.add_argument("id", type=row_id, help="mission id")
        json_flag(cmd)
        cmd.set_defaults(command_fn=fn)
    history = ms.add_parser(
        "history",
        help="A mission's iterations with their compactions.",
        description="List a mission's iterations, newest first, each with its compactions: the "
        "round each ran before, the turns it folded, tokens before and after, or why it "
        "failed. `mana-ai replay ITERATION_ID` shows the folded turns in place.",
    )
    history.add_argument("id", type=row_id, help="mission id")
    history.add_argument("--limit", type=limit, default=20, help="iterations at most (20)")
    json_flag(history)
    history.set_defaults(command_fn=_history)


async def _add(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.missions import MissionRequest, create_mission

    if args.objective_file is not None:
        objective = checked_text(_read_objective(args.objective_file), "--objective-file")
    else:
        objective = args.objective
    request = MissionRequest(
        agent=args.agent,
        objective=objective,
        cron=args.cron,
        timezone=args.timezone,
        at=args.at,
        due_now=args.due_now,
        deadline=args.deadline,
        catch_up=args.catch_up,
        catch_up_window=args.catch_up_window,
    )
    async with admin_store(settings) as admin:
        mission = await create_mission(admin, request)
    emit(
        args,
        mission,
        f"mission {mission['id']} created for agent {mission['agent']}; "
        f"next run at {fmt(mission['next_run_at'])}",
    )
    return 0


def _read_objective(path: str) -> str:
    """The text of ``path`` (``-``: standard input), read as UTF-8; at most a little more than
    the longest objective is read, so a huge file is refused without being loaded.

    What is not text is said first, whatever its size: a NUL byte (a binary file, like
    ``/bin/ls``) or bytes that are not UTF-8 in what was read; then a file longer than the
    longest objective is "too long".

    Raises:
        UsageError: the file cannot be read, is not UTF-8 text, or is too long.
    """
    limit_bytes = MAX_TEXT_CHARS * 4 + 1  # enough for MAX_TEXT_CHARS characters, plus one
    where = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit_bytes)
        else:
            with Path(path).open("rb") as file:
                data = file.read(limit_bytes)
    except OSError as exc:
        raise UsageError(f"--objective-file: cannot read {where}: {exc.strerror or exc}") from None
    cut = len(data) == limit_bytes  # there is more; what was read may end inside a character
    nul = data.find(b"\0")
    if nul >= 0:
        raise UsageError(
            f"--objective-file: {where} is not UTF-8 text (a NUL byte at byte {nul + 1}: "
            "a binary file?)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if not (cut and exc.reason == "unexpected end of data"):
            raise UsageError(
                f"--objective-file: {where} is not UTF-8 text (byte {exc.start + 1})"
            ) from None
        text = ""
    if cut:
        raise UsageError(
            f"--objective-file: {where} is too long; an objective holds at most "
            f"{MAX_TEXT_CHARS:,} characters"
        )
    return text


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    from worker.queries.reads import list_missions, pending_by_mission
    from worker.schedule import in_zone

    async def read(conn: AsyncConnection) -> tuple[list[dict[str, Any]], dict[int, int]]:
        rows = await list_missions(conn, status=args.status, limit=args.limit)
        return rows, await pending_by_mission(conn, [r["id"] for r in rows])

    rows, waiting = await read_only(settings, read)
    for row in rows:  # a run parked for a person's decision: the request it waits on
        row["awaiting_approval"] = waiting.get(row["id"])
        row["next_run_local"] = in_zone(row["next_run_at"], row["timezone"])
    if args.json:
        print_json(rows)
    else:
        for row in rows:
            if row["awaiting_approval"] is not None:
                row["status"] = f"{row['status']}, awaiting approval {row['awaiting_approval']}"
        table(rows, ["id", "agent", "status", "cron", "timezone", "next_run_at", "objective"])
    return 0


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    from worker.queries.reads import get_mission, pending_by_mission
    from worker.schedule import in_zone

    async def read(conn: AsyncConnection) -> tuple[dict[str, Any], dict[int, int]]:
        return await get_mission(conn, args.id), await pending_by_mission(conn, [args.id])

    mission, waiting = await read_only(settings, read)
    mission["awaiting_approval"] = waiting.get(args.id)
    # the next run in the schedule's own zone too (None in UTC)
    mission["next_run_local"] = in_zone(mission["next_run_at"], mission["timezone"])
    if args.json:
        print_json(mission)
    else:
        fields(mission)
    return 0


async def _history(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.verdict import with_warnings

    async with admin_store(settings) as admin:
        mission = await admin.mission_history(args.id, limit=args.limit)
        ids = [it["id"] for it in mission["iterations"]]
        with_warnings(mission["iterations"], await admin.answers_of(ids))
    if args.json:
        print_json(mission)
        return 0
    shown = len(mission["iterations"])
    print(
        f"mission {mission['id']} (agent {visible_line(mission['agent'])}, {mission['status']}): "
        f"{mission['iteration_count']} iteration(s)"
        + (f", the latest {shown} shown" if shown < mission["iteration_count"] else "")
    )
    for it in mission["iterations"]:
        tokens = it["prompt_tokens"] + it["completion_tokens"]
        print(
            f"  iteration {it['id']} scheduled for {fmt(it['scheduled_for'])}: {it['status']}, "
            f"{it['rounds']} round(s), {tokens} tokens, "
            f"stop reason {visible_line(fmt(it['stop_reason']))}"
            + (f", attempt {it['attempt']}" if it["attempt"] > 1 else "")
        )
        if it["error"]:
            print(f"    error: {visible_line(it['error'])}")
        if it["warning"]:
            print(f"    warning: {visible_line(it['warning'])}")
        for c in it["compactions"]:
            if c["error"]:
                print(
                    f"    compaction {c['compaction_index']} before round {c['round']}: "
                    f"failed, nothing folded: {visible_line(c['error'])}"
                )
            else:
                print(
                    f"    compaction {c['compaction_index']} before round {c['round']}: "
                    f"{c['folded_turns']} turn(s) folded, {c['tokens_before']} -> "
                    f"{c['tokens_after']} tokens (estimated), by "
                    f"{visible_line(c['model'] or 'the default model')} in "
                    f"{c['duration_ms']:.0f} ms"
                )
    return 0


async def _pause(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.missions import pause_mission

    async with admin_store(settings) as admin:
        course = await pause_mission(admin, args.id)
    text = f"mission {args.id} paused"
    if not course.changed:
        text = f"mission {args.id} is already paused (unchanged)"
    emit(args, course.mission, text)
    return 0


async def _resume(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.missions import resume_mission

    async with admin_store(settings) as admin:
        course = await resume_mission(admin, args.id)
    mission = course.mission
    parked = course.note is not None and course.note.startswith("parked run")
    if not course.changed and parked:
        text = (
            f"mission {args.id} is already active; its {course.note} waits for an approval "
            "(`mana-ai approvals list --status pending`) and goes on once it is decided"
        )
    elif not course.changed:
        text = (
            f"mission {args.id} is already active; next run at "
            f"{fmt(mission['next_run_at'])} (unchanged)"
        )
    elif course.note == "deadline passed":
        # the claim completes it without a run (the deadline rule lives there)
        text = (
            f"mission {args.id} resumed, but its deadline {fmt(mission['deadline'])} has "
            "passed: the next tick completes it without a run"
        )
    elif parked:
        text = (
            f"mission {args.id} resumed; its {course.note} for an approval goes on once the "
            "request is decided (at once when it was)"
        )
    else:
        text = f"mission {args.id} resumed; next run at {fmt(mission['next_run_at'])}"
    emit(args, mission, text)
    return 0
