"""``mana-ai replay``: a stored iteration with the turns compaction folded restored in place;
``--rerun`` drives today's loop against what it recorded and reports what now differs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, cast

from worker.cli.args import iteration_ref, json_flag
from worker.cli.output import print_json
from worker.cli.stores import admin_store

if TYPE_CHECKING:
    from planner.policy import PolicyMode
    from worker.settings import Settings
    from worker.store.stored import StoredIteration

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
            config = await _rerun_config(admin, settings, iteration, args.policy_mode)
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
            from worker.admin.replay import md_inline

            first, *rest = report.lines()
            print(f"# {md_inline(first[0].upper() + first[1:])}\n")
            for line in rest:
                print(f"- {md_inline(line.strip())}")
        else:
            for line in report.lines():
                print(line)
        return 0

    from worker.admin.replay import render_markdown, render_text, replay_events

    events = replay_events(iteration)
    if as_json:
        header = {k: v for k, v in iteration.items() if k not in ("messages", "tool_invocations")}
        header["compactions"] = [
            {k: v for k, v in c.items() if k != "folded"} for c in iteration["compactions"]
        ]
        print_json({"iteration": header, "events": events})
    elif args.format == "markdown":
        render_markdown(iteration, events, print)
    else:
        render_text(iteration, events, print)
    return 0


async def _rerun_config(
    admin: Any, settings: Settings, iteration: StoredIteration, policy_mode: str | None
) -> Any:
    """Today's settings for the iteration's agent (the mission's agent as it is now)."""
    from planner.policy import DestructivePolicy
    from worker.admin.rerun import RerunConfig
    from worker.daemon.app import check_policy_settings, offered_tools, web_fetch_config
    from worker.policy_setup import policy_config_from_settings
    from worker.store.user_policy import PolicyStore
    from worker.tools import builtin_tool_catalog, builtin_tools

    check_policy_settings(settings, builtin_tool_catalog())  # a typo would mislead the report
    mission = await admin.get_mission(iteration["mission_id"])
    agent = await admin.agent_by_name(mission["agent"])
    user_settings = await PolicyStore(admin.engine).user_settings(agent["owner_user_id"])
    tools = builtin_tools(admin.engine, web=web_fetch_config(settings))
    exposed = frozenset(settings.policy_mission_scopes) or None
    compact_max_ctx = agent.get("compact_max_ctx")
    return RerunConfig(
        tools=offered_tools(tools, agent["allowed_tools"], settings.policy_mission_scopes),
        max_rounds=agent["max_rounds"],
        policy_mode=cast(
            "PolicyMode", policy_mode or agent.get("policy_mode") or settings.policy_mode
        ),
        policy_config=policy_config_from_settings(settings, exposed_scopes=exposed),
        user_settings=user_settings,
        user_id=agent["owner_user_id"],
        compact_max_ctx=compact_max_ctx
        if compact_max_ctx is not None
        else settings.compact_max_ctx,
        compact_threshold=settings.compact_threshold,
        compact_max_per_iteration=settings.compact_max_per_iteration,
        compact_model=settings.compact_model,
        summariser_max_ctx=settings.compact_model_max_ctx,
        reminders=settings.reminders == "on",
        reminders_disabled=frozenset(settings.reminders_disabled),
        reminder_role=settings.reminder_role,
        max_tokens_per_day=agent.get("max_tokens_per_day"),
        destructive=DestructivePolicy(
            agent.get("destructive_policy") or settings.policy_destructive
        ),
    )
