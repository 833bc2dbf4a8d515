"""The ``mana-ai`` command. Run ``mana-ai --help`` or ``mana-ai COMMAND --help``.

Exit status: 0 success, 1 an operator error (the message says what and how to fix it),
2 bad usage or invalid settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from worker.errors import ManaAIError, NotFoundError
from worker.settings import Settings, load_settings, unknown_variables

if TYPE_CHECKING:
    from worker.db.admin import AdminStore

__all__ = ["main"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant that works through tools. Use the tools to complete the "
    "objective, then answer with a short summary of what you did."
)

Command = Callable[[argparse.Namespace, Settings], Awaitable[int]]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mana-ai`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "command_fn"):
        parser.print_help()
        return 2
    try:
        settings = load_settings()
    except ManaAIError as exc:
        print(f"mana-ai: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    from worker.logs import configure_logging

    quiet = not getattr(args, "verbose_logs", False)
    level = "WARNING" if quiet and settings.log_level.upper() == "INFO" else settings.log_level
    configure_logging(level, settings.log_format)
    for name in unknown_variables():
        print(f"mana-ai: warning: ignoring unknown setting {name}", file=sys.stderr)
    try:
        status: int = asyncio.run(args.command_fn(args, settings))
        return status
    except _UsageError as exc:
        print(f"mana-ai: usage error: {exc}", file=sys.stderr)
        return 2
    except ManaAIError as exc:
        print(f"mana-ai: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `mana-ai … | head`: the reader left; that is not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (SQLAlchemyError, OSError) as exc:  # the database went away mid-command
        from worker.db.engine import describe_error

        print(f"mana-ai: database error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# -- parser -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mana-ai",
        description=(
            "Run scheduled missions for LLM agents. Settings come from MANA_AI_* environment "
            "variables (see README). With no MANA_AI_DATABASE_URL an embedded PostgreSQL "
            "is started in MANA_AI_DATA_DIR; with no MANA_AI_LLM_BASE_URL the embedded "
            "SmolLM2 model answers."
        ),
    )
    parser.add_argument("--version", action="version", version=f"mana-ai {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    db = _group(commands, "db", "Database schema.")
    upgrade = db.add_parser(
        "upgrade",
        help="Migrate the schema to the latest revision (safe with replicas: advisory lock).",
        description="Migrate the schema to the latest revision under a PostgreSQL advisory "
        "lock, so replicas starting together do not collide.",
    )
    upgrade.set_defaults(command_fn=_db_upgrade)

    ag = _group(commands, "agents", "Agents: a model, a system prompt, limits and tools.")
    add = ag.add_parser("add", help="Create an agent.", description="Create an agent.")
    add.add_argument("--name", required=True, help="unique agent name")
    add.add_argument("--owner", required=True, help="owner user id; tools act in their space")
    add.add_argument("--system-prompt", default=DEFAULT_SYSTEM_PROMPT, help="agent instructions")
    add.add_argument("--model", help="model name (default: MANA_AI_LLM_MODEL / provider default)")
    add.add_argument("--max-rounds", type=_positive_int, default=5, help="rounds per run (5)")
    add.add_argument(
        "--max-tokens-per-day", type=_positive_int, help="daily token budget (none by default)"
    )
    add.add_argument(
        "--tools",
        help="comma-separated tool names the agent may call (default: all built-in tools)",
    )
    add.add_argument(
        "--if-not-exists",
        action="store_true",
        help="succeed without changes when an agent with this name exists",
    )
    _json_flag(add)
    add.set_defaults(command_fn=_agents_add)
    lst = ag.add_parser("list", help="List agents.", description="List agents.")
    _json_flag(lst)
    lst.set_defaults(command_fn=_agents_list)

    ms = _group(commands, "missions", "Missions: an agent, an objective, a schedule.")
    add = ms.add_parser(
        "add",
        help="Create a mission.",
        description="Create a mission. Give --cron for a recurring mission (5-field cron, "
        "evaluated in --timezone), or --at / --due-now alone for a one-shot mission.",
    )
    add.add_argument("--agent", required=True, help="agent name")
    add.add_argument("--objective", required=True, help="what the agent should do each run")
    add.add_argument("--cron", help="5-field cron expression, e.g. '0 9 * * 1-5'")
    add.add_argument("--timezone", default="UTC", help="IANA timezone of --cron (UTC)")
    add.add_argument("--at", type=_aware_datetime, help="one-shot run time, ISO 8601 with offset")
    add.add_argument(
        "--due-now", action="store_true", help="first run at the next tick instead of per --cron"
    )
    add.add_argument(
        "--deadline", type=_aware_datetime, help="no runs after this time (ISO 8601 with offset)"
    )
    _json_flag(add)
    add.set_defaults(command_fn=_missions_add)
    lst = ms.add_parser("list", help="List missions.", description="List missions, newest first.")
    lst.add_argument(
        "--status", choices=["active", "paused", "completed"], help="only missions in this status"
    )
    lst.add_argument("--limit", type=_limit, default=100, help="rows at most (100)")
    _json_flag(lst)
    lst.set_defaults(command_fn=_missions_list)
    for name, helptext, fn in (
        ("show", "Show one mission.", _missions_show),
        ("pause", "Pause a mission (a running iteration finishes).", _missions_pause),
        ("resume", "Resume a paused mission at its next cron time.", _missions_resume),
    ):
        cmd = ms.add_parser(name, help=helptext, description=helptext)
        cmd.add_argument("id", type=_row_id, help="mission id")
        _json_flag(cmd)
        cmd.set_defaults(command_fn=fn)

    tick = commands.add_parser(
        "tick",
        help="Run one tick: claim due missions, run them, store iterations, exit.",
        description="Claim the due missions (up to MANA_AI_MAX_CONCURRENT_MISSIONS), run them, "
        "wait for them and exit. Exit status 1 if any run failed.",
    )
    tick.add_argument("--once", action="store_true", help="run a single tick (the default)")
    _json_flag(tick)
    tick.set_defaults(command_fn=_tick, verbose_logs=True)

    worker = commands.add_parser(
        "worker",
        help="Run the daemon: tick every MANA_AI_TICK_INTERVAL_S until SIGTERM/SIGINT.",
        description="Run the daemon. Migrates the schema at start, serves /metrics and "
        "/healthz on MANA_AI_METRICS_PORT, and on SIGTERM/SIGINT stops claiming, lets running "
        "missions finish within MANA_AI_SHUTDOWN_GRACE_S and exits 0.",
    )
    worker.set_defaults(command_fn=_worker, verbose_logs=True)

    it = _group(commands, "iterations", "Iterations: stored mission runs.")
    lst = it.add_parser(
        "list", help="List iterations.", description="List iterations, newest first."
    )
    lst.add_argument("--mission", type=_row_id, help="only this mission's iterations")
    lst.add_argument("--limit", type=_limit, default=20, help="rows at most (20)")
    _json_flag(lst)
    lst.set_defaults(command_fn=_iterations_list)
    show = it.add_parser(
        "show",
        help="Show one iteration: its message log and tool calls.",
        description="Show one iteration: outcome, usage, the stored message log and every tool "
        "call with its arguments, result or error.",
    )
    show.add_argument("id", type=_iteration_ref, help="iteration id, or 'latest'")
    _json_flag(show)
    show.set_defaults(command_fn=_iterations_show)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mana-ai")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def _group(commands: Any, name: str, helptext: str) -> Any:
    group = commands.add_parser(name, help=helptext, description=helptext)
    return group.add_subparsers(title="commands", metavar="COMMAND", required=True)


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


_MAX_LIMIT = 10_000


def _limit(text: str) -> int:
    value = _positive_int(text)
    if value > _MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"expected at most {_MAX_LIMIT}, got {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


_MAX_ID = 2**63 - 1  # ids are BIGINT


def _row_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a numeric id, got {text!r}") from None
    if not 1 <= value <= _MAX_ID:
        raise argparse.ArgumentTypeError(f"ids run from 1 to {_MAX_ID}, got {value}")
    return value


def _iteration_ref(text: str) -> int | None:
    if text == "latest":
        return None
    if not text.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"expected an id or 'latest', got {text!r}")
    return _row_id(text)


def _aware_datetime(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ISO 8601 like 2026-12-01T09:00+01:00, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset; add one, e.g. +00:00")
    return value


# -- commands -----------------------------------------------------------------------------


async def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from worker.app import open_database
    from worker.db.migrate import current_revision

    async with open_database(settings, migrate=True) as engine:
        print(f"database schema at revision {await current_revision(engine)}")
    return 0


async def _agents_add(args: argparse.Namespace, settings: Settings) -> int:
    from worker.tools import builtin_tools

    name, owner = args.name.strip(), args.owner.strip()
    if not name or not owner:
        raise _usage("--name and --owner must not be empty")
    async with _admin(settings) as admin:
        tools = None
        if args.tools is not None:
            tools = list(dict.fromkeys(t.strip() for t in args.tools.split(",") if t.strip()))
            if not tools:
                raise _usage("--tools names no tool; leave it out to allow every built-in tool")
            known = [t.name for t in builtin_tools(admin.engine)]
            unknown = sorted(set(tools) - set(known))
            if unknown:
                raise _usage(f"unknown tool(s) {', '.join(unknown)}; available: {', '.join(known)}")
        if args.if_not_exists:
            try:
                existing = await admin.agent_by_name(name)
            except NotFoundError:
                pass
            else:
                _emit(args, existing, f"agent {name} exists (id {existing['id']}); unchanged")
                return 0
        agent = await admin.add_agent(
            name=name,
            owner_user_id=owner,
            system_prompt=args.system_prompt,
            model=args.model,
            max_rounds=args.max_rounds,
            max_tokens_per_day=args.max_tokens_per_day,
            allowed_tools=tools,
        )
    _emit(args, agent, f"agent {agent['name']} created (id {agent['id']})")
    return 0


async def _agents_list(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin(settings) as admin:
        rows = await admin.list_agents()
    if args.json:
        _print_json(rows)
    else:
        _table(rows, ["id", "name", "owner_user_id", "model", "max_rounds", "allowed_tools"])
    return 0


async def _missions_add(args: argparse.Namespace, settings: Settings) -> int:
    from worker.schedule import next_run_after, parse_timezone

    if not args.objective.strip():
        raise _usage("--objective must not be empty")
    if not args.agent.strip():
        raise _usage("--agent must not be empty")
    if args.cron is None and args.at is None and not args.due_now:
        raise _usage(
            "give --cron EXPR for a recurring mission, or --at TIME / --due-now for a one-shot"
        )
    if args.cron is not None and args.at is not None:
        raise _usage("--at is for one-shot missions; a --cron mission runs at its cron times")
    if args.at is not None and args.due_now:
        raise _usage("give either --at TIME or --due-now, not both")
    parse_timezone(args.timezone)
    now = datetime.now(UTC)
    cron_next = None
    if args.cron is not None:
        cron_next = next_run_after(args.cron, args.timezone, now)  # raises ScheduleError
        if cron_next is None:
            raise _usage(f"cron expression {args.cron!r} never fires")
    first: datetime
    if args.due_now:
        first = now
    elif args.at is not None:
        if args.at < now:
            raise _usage(
                f"--at {args.at.isoformat()} is in the past; use --due-now to run at the next tick"
            )
        first = args.at
    else:
        assert cron_next is not None  # one of --cron / --at / --due-now was checked above
        first = cron_next
    if args.deadline is not None and args.deadline < first:
        raise _usage(f"--deadline {args.deadline.isoformat()} is before the first run")
    async with _admin(settings) as admin:
        agent = await admin.agent_by_name(args.agent)
        mission = await admin.add_mission(
            agent_id=agent["id"],
            objective=args.objective,
            cron=args.cron,
            timezone=args.timezone,
            next_run_at=first,
            deadline=args.deadline,
        )
    _emit(
        args,
        mission,
        f"mission {mission['id']} created for agent {args.agent}; "
        f"next run at {_fmt(mission['next_run_at'])}",
    )
    return 0


async def _missions_list(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin(settings) as admin:
        rows = await admin.list_missions(status=args.status, limit=args.limit)
    if args.json:
        _print_json(rows)
    else:
        _table(rows, ["id", "agent", "status", "cron", "timezone", "next_run_at", "objective"])
    return 0


async def _missions_show(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin(settings) as admin:
        mission = await admin.get_mission(args.id)
    if args.json:
        _print_json(mission)
    else:
        for key, value in mission.items():
            print(f"{key:>18}: {_fmt(value)}")
    return 0


async def _missions_pause(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin(settings) as admin:
        mission = await admin.pause_mission(args.id)
    _emit(args, mission, f"mission {args.id} paused")
    return 0


async def _missions_resume(args: argparse.Namespace, settings: Settings) -> int:
    from worker.schedule import next_run_after

    async with _admin(settings) as admin:
        current = await admin.get_mission(args.id)
        if current["status"] == "active":
            _emit(
                args,
                current,
                f"mission {args.id} is already active; next run at "
                f"{_fmt(current['next_run_at'])} (unchanged)",
            )
            return 0
        next_run = None
        if current["cron"] is not None:
            next_run = next_run_after(current["cron"], current["timezone"], datetime.now(UTC))
        mission = await admin.resume_mission(args.id, next_run_at=next_run)
    _emit(args, mission, f"mission {args.id} resumed; next run at {_fmt(mission['next_run_at'])}")
    return 0


async def _tick(args: argparse.Namespace, settings: Settings) -> int:
    from worker.app import open_app

    async with open_app(settings) as app:
        outcomes = await app.worker.run_once()
    if args.json:
        _print_json({"missions_run": len(outcomes), "outcomes": outcomes})
    else:
        print(f"tick ran {len(outcomes)} mission(s): {', '.join(outcomes) or 'none due'}")
    return 1 if any(o in ("failed", "error") for o in outcomes) else 0


async def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from worker.scheduler import serve

    return await serve(settings)


async def _iterations_list(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin(settings) as admin:
        rows = await admin.list_iterations(mission_id=args.mission, limit=args.limit)
    if args.json:
        _print_json(rows)
    else:
        for row in rows:
            row["tokens"] = row["prompt_tokens"] + row["completion_tokens"]
        _table(
            rows,
            [
                "id",
                "mission_id",
                "scheduled_for",
                "status",
                "attempt",
                "rounds",
                "tokens",
                "stop_reason",
                "error",
            ],
        )
    return 0


async def _iterations_show(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin(settings) as admin:
        iteration_id = args.id
        if iteration_id is None:
            latest = await admin.list_iterations(limit=1)
            if not latest:
                raise NotFoundError("no iterations stored yet (run `mana-ai tick --once`)")
            iteration_id = latest[0]["id"]
        it = await admin.get_iteration(iteration_id)
    if args.json:
        _print_json(it)
        return 0
    print(
        f"iteration {it['id']} of mission {it['mission_id']}: {it['status']} "
        f"(attempt {it['attempt']}, worker {it['worker_id']})"
    )
    print(
        f"  scheduled for {_fmt(it['scheduled_for'])}, started {_fmt(it['started_at'])}, "
        f"finished {_fmt(it['finished_at'])}"
    )
    infos = [m["reply_info"] for m in it["messages"] if m.get("reply_info")]
    estimated = any((i.get("usage") or {}).get("estimated") for i in infos)
    print(
        f"  rounds {it['rounds']}, tokens {it['prompt_tokens']} prompt + "
        f"{it['completion_tokens']} completion"
        f"{' (partly estimated: the endpoint did not report all usage)' if estimated else ''}, "
        f"stop reason {it['stop_reason']}"
    )
    if it["error"]:
        print(f"  error: {it['error']}")
    print("\nmessage log:")
    for message in it["messages"]:
        label = _message_label(message)
        if message.get("content") is not None:
            print(f"  {label} {message['content']}")
        for call in message.get("tool_calls", []):
            arguments = json.dumps(call.get("arguments", {}))
            if call.get("raw_arguments") is not None:
                arguments = f"<undecodable: {call['raw_arguments']!r}>"
            print(f"  {label} calls {call['name']}({arguments}) id={call['id']}")
    print("\ntool calls:")
    if not it["tool_invocations"]:
        print("  (none)")
    for inv in it["tool_invocations"]:
        detail = (
            f"error: {inv['error']}" if inv["error"] else f"result: {json.dumps(inv['result'])}"
        )
        print(
            f"  round {inv['round']} {inv['tool']}({json.dumps(inv['arguments'])}) "
            f"{inv['outcome']} in {inv['duration_ms']:.1f} ms; {detail}"
        )
    return 0


def _message_label(message: dict[str, Any]) -> str:
    """``[role]``, ``[tool <call id>]`` or ``[assistant via <endpoint>, finish_reason …]``.

    Provider fields (reasoning text, signatures) are left out here; ``--json`` shows them.
    """
    parts = [message["role"]]
    if message.get("tool_call_id"):
        parts.append(message["tool_call_id"])
    info = message.get("reply_info") or {}
    if info.get("endpoint"):
        parts.append(f"via {info['endpoint']}")
    label = " ".join(parts)
    if info.get("finish_reason") not in (None, "stop", "tool_calls"):
        label += f", finish_reason {info['finish_reason']}"
    return f"[{label}]"


@asynccontextmanager
async def _admin(settings: Settings) -> AsyncIterator[AdminStore]:
    from worker.app import open_database
    from worker.db.admin import AdminStore

    async with open_database(settings) as engine:
        yield AdminStore(engine)


# -- output -------------------------------------------------------------------------------


class _UsageError(ManaAIError):
    pass


def _usage(message: str) -> _UsageError:
    return _UsageError(message)


def _fmt(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_jsonable(value), indent=2, ensure_ascii=False))


def _emit(args: argparse.Namespace, row: dict[str, Any], text: str) -> None:
    if args.json:
        _print_json(row)
    else:
        print(text)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    last = len(columns) - 1
    cells = [
        [
            _fmt(r.get(c)).replace("\n", " ")[: None if i == last else 60]
            for i, c in enumerate(columns)
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


if __name__ == "__main__":
    raise SystemExit(main())
