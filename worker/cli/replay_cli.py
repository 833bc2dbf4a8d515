"""``mana-ai replay``: a stored iteration with the turns compaction folded restored in place;
``--rerun`` drives today's loop against what it recorded and reports what now differs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from worker.cli.args import iteration_ref, json_flag
from worker.cli.output import print_json
from worker.cli.stores import admin_store

if TYPE_CHECKING:
    from worker.settings import Settings

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``replay``."""
    replay = commands.add_parser(
        "replay",
        help="Replay a stored iteration, folded turns restored; --rerun compares today's rules.",
        description=(
            "Print a stored iteration as the whole conversation: the turns compaction folded "
            "are restored in place from the archive, each compaction marked with the summary "
            "the model read instead, and every round with the reminders sent and the policy "
            "decision on each tool call. With --rerun, drive today's planner loop, policy "
            "gate, compaction and reminders against the recorded model replies and tool "
            "results (nothing live runs: no LLM request, no tool side effect) and report "
            "where behaviour now differs."
        ),
    )
    replay.add_argument("id", type=iteration_ref, help="iteration id, or 'latest'")
    replay.add_argument(
        "--format",
        choices=["text", "markdown", "json"],
        default="text",
        help="output format (text)",
    )
    replay.add_argument(
        "--rerun",
        action="store_true",
        help="rerun against the recording with today's code and settings and report the "
        "differences",
    )
    replay.add_argument(
        "--policy-mode",
        choices=["off", "log-only", "enforce"],
        help="with --rerun: the policy mode to try instead of today's (the agent's, else "
        "MANA_AI_POLICY_MODE)",
    )
    json_flag(replay)
    replay.set_defaults(command_fn=_replay)


async def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from worker.cli.args import UsageError

    if args.policy_mode is not None and not args.rerun:
        raise UsageError("--policy-mode goes with --rerun")
    as_json = args.json or args.format == "json"
    async with admin_store(settings) as admin:
        iteration = await admin.get_iteration(await admin.iteration_id_or_latest(args.id))
        if args.rerun:
            from worker.daemon.app import rerun_config

            config = await rerun_config(admin, settings, iteration, args.policy_mode)
    if args.rerun:
        import logging

        from worker.admin.rerun import rerun_iteration

        # what the loop logs in a rerun (a replayed compaction failure, a would-be denial)
        # happened long ago: the report says what matters
        planner_logger = logging.getLogger("planner")
        level = planner_logger.level
        planner_logger.setLevel(logging.ERROR)
        try:
            report = await rerun_iteration(iteration, config)
        finally:
            planner_logger.setLevel(level)
        if as_json:
            print_json(report.to_json())
        elif args.format == "markdown":
            from worker.admin.replay_render import md_inline

            first, *rest = report.lines()
            print(f"# {md_inline(first[0].upper() + first[1:])}\n")
            for line in rest:
                print(f"- {md_inline(line.strip())}")
        else:
            for line in report.lines():
                print(line)
        return 0

    from worker.admin.replay import replay_document, replay_events
    from worker.admin.replay_render import render_markdown, render_text

    if as_json:
        print_json(replay_document(iteration))
        return 0
    events = replay_events(iteration)
    if args.format == "markdown":
        render_markdown(iteration, events, print)
    else:
        render_text(iteration, events, print)
    return 0
