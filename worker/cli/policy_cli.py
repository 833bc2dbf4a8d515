"""``mana-ai policy``: users' destructive opt-ins and rate limits, and the rollout report.

The rules themselves are ``planner.policy.evaluate_policy``; these commands only change what a
user allowed (table ``user_policy_settings``) and read what the gate decided
(``tool_invocations``). A change applies to iterations that start after it.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from worker.admin.values import parse_since
from worker.cli.args import UsageError, checked_name, group, json_flag
from worker.cli.output import emit, fmt, print_json, table
from worker.cli.stores import policy_store
from worker.terminal_text import visible_line

if TYPE_CHECKING:
    from planner import ToolSpec
    from worker.queries.user_policy import PolicyReport, PolicyStore
    from worker.settings import Settings

__all__ = ["ENFORCE_SWITCH_SHARE", "parse_since", "register"]

ENFORCE_SWITCH_SHARE = 0.01
"""The seed design's switch criterion: under 1 % would-be denials over a week of log-only."""


def register(commands: Any) -> None:
    """Add ``policy show|allow-destructive|revoke-destructive|set-rate-limit|report``."""
    pol = group(
        commands,
        "policy",
        "The policy gate: users' destructive opt-ins and rate limits, and the rollout report.",
    )
    _register_show(pol)
    _register_opt_ins(pol)
    _register_rate_limit(pol)
    _register_report(pol)


def _register_show(pol: Any) -> None:
    """``policy show``."""
    show = pol.add_parser(
        "show",
        help="Show a user's policy settings and the limits that apply to them.",
        description="Show a user's destructive opt-ins, rate-limit overrides and the "
        "effective rate limit of every tool (users without settings get the defaults).",
    )
    show.add_argument("user", help="user id (an agent's --owner)")
    json_flag(show)
    show.set_defaults(command_fn=_show)


def _register_opt_ins(pol: Any) -> None:
    """``policy allow-destructive`` and ``policy revoke-destructive``."""
    for name, verb, fn in (
        ("allow-destructive", "Let a user's agents call a destructive tool", _allow),
        ("revoke-destructive", "Take back a user's opt-in to a destructive tool", _revoke),
    ):
        cmd = pol.add_parser(
            name,
            help=f"{verb} (or every destructive tool of a scope).",
            description=f"{verb}, or every destructive tool of a scope. Applies to iterations "
            "that start afterwards.",
        )
        cmd.add_argument("user", help="user id (an agent's --owner)")
        cmd.add_argument("target", metavar="TOOL_OR_SCOPE", help="a tool name or a scope")
        json_flag(cmd)
        cmd.set_defaults(command_fn=fn)


def _register_rate_limit(pol: Any) -> None:
    """``policy set-rate-limit``."""
    rate = pol.add_parser(
        "set-rate-limit",
        help="Set a user's rate limit (calls per window), for one tool or all.",
        description="Set how many calls of a tool the user's agents may make per rolling "
        "window (MANA_AI_POLICY_RATE_WINDOW_S), for one --tool or for every tool. "
        "'default' removes the override.",
    )
    rate.add_argument("user", help="user id (an agent's --owner)")
    rate.add_argument("calls", metavar="N", type=_calls, help="calls per window, or 'default'")
    rate.add_argument("--tool", help="only this tool (default: every tool of the user)")
    json_flag(rate)
    rate.set_defaults(command_fn=_set_rate_limit)


def _register_report(pol: Any) -> None:
    """``policy report``."""
    report = pol.add_parser(
        "report",
        help="Decisions by reason, tool, mode and consumer; the would-be deny share of log-only.",
        description="What the gate decided over a period, for missions and MCP clients: calls "
        "by mode, consumer, reason and tool; in "
        "log-only, how many calls enforce would have denied and their share of all calls "
        f"(switch to enforce when it stays under {ENFORCE_SWITCH_SHARE:.0%} over a week).",
    )
    report.add_argument(
        "--since",
        type=parse_since,
        default=timedelta(days=7),
        help="period: a duration like 7d, 24h, 30m, 90s (default 7d)",
    )
    json_flag(report)
    report.set_defaults(command_fn=_report)


def _calls(text: str) -> int | None:
    if text.strip().lower() == "default":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of calls or 'default', got {text!r}"
        ) from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 100000 calls, got {value}")
    return value


def _known_tools() -> list[ToolSpec]:
    from worker.tools import builtin_tool_catalog

    return builtin_tool_catalog()


def _check_target(target: str, tools: list[ToolSpec]) -> str:
    """A known destructive tool, or a scope with destructive tools, or an MCP server's scope
    (``mcp:NAME``) or tool (``NAME__tool``: what an MCP server offers is known only when a run
    lists it); anything else is refused with the lists (before the database is opened)."""
    from worker.mcp.config import is_mcp_scope, is_mcp_tool_name

    target = checked_name(target, "TOOL_OR_SCOPE")
    if is_mcp_scope(target) or is_mcp_tool_name(target):
        return target
    by_name = {t.name: t for t in tools}
    destructive = sorted(t.name for t in tools if t.policy_hint == "destructive")
    scopes = sorted({t.scope for t in tools if t.policy_hint == "destructive"})
    known = (
        f"destructive tools: {', '.join(destructive) or '(none)'}; "
        f"their scopes: {', '.join(scopes) or '(none)'}; "
        "or an MCP server's scope mcp:NAME or tool NAME__tool"
    )
    if target in by_name:
        if by_name[target].policy_hint != "destructive":
            raise UsageError(
                f"{target} is not destructive ({by_name[target].policy_hint}); it needs no "
                f"opt-in. {known[0].upper()}{known[1:]}"
            )
        return target
    if target in scopes:
        return target
    if target in {t.scope for t in tools}:
        raise UsageError(f"scope {target!r} has no destructive tools; {known}")
    raise UsageError(f"unknown tool or scope {target!r}; {known}")


def _check_tool(tool: str | None) -> str | None:
    from worker.mcp.config import is_mcp_tool_name

    if tool is None:
        return None
    tool = checked_name(tool, "--tool")
    known = [t.name for t in _known_tools()]
    if tool not in known and not is_mcp_tool_name(tool):
        raise UsageError(
            f"unknown tool {tool!r}; available: {', '.join(known)}, or an MCP server's tool "
            "NAME__tool"
        )
    return tool


async def _warn_if_no_agent(store: PolicyStore, user: str) -> None:
    if not await store.owns_agents(user):
        print(
            f"mana-ai: note: no agent is owned by user {user!r} (yet); the setting applies "
            "to agents whose --owner is that user",
            file=sys.stderr,
        )


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    user = checked_name(args.user, "the user id")
    tools = _known_tools()
    async with policy_store(settings) as store:
        row = await store.get(user)
        owns = await store.owns_agents(user)
    result = _policy_view(settings, user, row, owns, tools)
    if args.json:
        print_json(result)
        return 0
    _print_policy(settings, result, row)
    return 0


def _policy_view(
    settings: Settings, user: str, row: dict[str, Any] | None, owns: bool, tools: list[ToolSpec]
) -> dict[str, Any]:
    """``policy show``'s JSON: the user's settings, the defaults, and each tool's limit."""
    from worker.policy_setup import policy_config_from_settings
    from worker.store.records import user_settings_from_row

    config = policy_config_from_settings(settings)
    user_settings = user_settings_from_row(row)
    window_s = config.rate_limit.window.total_seconds()
    scopes = list(settings.policy.mission_scopes)
    return {
        "user_id": user,
        "owns_agents": owns,
        "destructive_opt_ins": sorted(user_settings.destructive_opt_ins),
        "rate_limit": user_settings.rate_limit,
        "tool_rate_limits": dict(user_settings.tool_rate_limits),
        "updated_at": row["updated_at"] if row else None,
        "default_mode": settings.policy.mode,
        "mission_scopes": scopes or None,
        "window_s": window_s,
        "tools": [
            {
                "tool": t.name,
                "policy_hint": t.policy_hint,
                "scope": t.scope,
                "calls_per_window": config.rate_limit_source(t.name, user_settings)[0],
                "limit_from": config.rate_limit_source(t.name, user_settings)[1],
                "opted_in": user_settings.opted_in(t) if t.policy_hint == "destructive" else None,
                "exposed_to_missions": not scopes or t.scope in scopes,
            }
            for t in tools
        ],
    }


def _print_policy(settings: Settings, result: dict[str, Any], row: dict[str, Any] | None) -> None:
    """``policy show`` for people: the user's settings, then the limits in effect per tool."""
    user, owns, window_s = result["user_id"], result["owns_agents"], result["window_s"]
    scopes = result["mission_scopes"] or []
    saved = f"settings saved {fmt(row['updated_at'])}" if row else "no settings of their own"
    print(f"user {user}: {saved}" + ("" if owns else "; owns no agent"))
    opt_ins = visible_line(", ".join(result["destructive_opt_ins"]))
    print(f"  destructive opt-ins: {opt_ins or '(none)'}")
    print(f"  rate limit for every tool: {fmt(result['rate_limit'])}")
    overrides = visible_line(
        ", ".join(f"{k}={v}" for k, v in sorted(result["tool_rate_limits"].items()))
    )
    print(f"  rate limits per tool: {overrides or '(none)'}")
    print(f"  mode: {settings.policy.mode} (MANA_AI_POLICY_MODE; agents may override it)")
    print(f"  scopes missions may use: {', '.join(scopes) or 'every scope'}")
    print(
        f"\nlimits in effect, calls per {window_s:g} s (the most specific wins: user+tool, "
        "tool, user, default):"
    )
    table(
        [
            t
            | {
                "calls": f"{t['calls_per_window']} ({t['limit_from']})",
                "opt_in": "-" if t["opted_in"] is None else ("yes" if t["opted_in"] else "no"),
            }
            for t in result["tools"]
        ],
        ["tool", "policy_hint", "scope", "calls", "opt_in"],
    )


async def _allow(args: argparse.Namespace, settings: Settings) -> int:
    user = checked_name(args.user, "the user id")
    target = _check_target(args.target, _known_tools())
    async with policy_store(settings) as store:
        row = await store.allow_destructive(user, target)
        await _warn_if_no_agent(store, user)
    emit(
        args,
        row,
        f"user {user} opted in to {target}; opt-ins now: "
        f"{visible_line(', '.join(row['destructive_opt_ins']))}",
    )
    return 0


async def _revoke(args: argparse.Namespace, settings: Settings) -> int:
    user = checked_name(args.user, "the user id")
    target = checked_name(args.target, "TOOL_OR_SCOPE")
    tools = _known_tools()
    async with policy_store(settings) as store:
        current = await store.get(user)
        opt_ins = list((current or {}).get("destructive_opt_ins") or ())
        if target not in opt_ins:
            _check_target(target, tools)  # a typo is refused with the known names
            emit(
                args,
                current or {"user_id": user, "destructive_opt_ins": []},
                f"user {user} had not opted in to {target}; nothing changed "
                f"(opt-ins: {visible_line(', '.join(opt_ins)) or '(none)'})",
            )
            return 0
        row = await store.revoke_destructive(user, target)
    remaining = list(row["destructive_opt_ins"])
    now = visible_line(", ".join(remaining)) or "(none)"
    text = f"user {user}'s opt-in to {target} revoked; opt-ins now: {now}"
    spec = next((t for t in tools if t.name == target), None)
    scope = spec.scope if spec is not None else _mcp_scope_of(target)
    if scope is not None and scope in remaining:
        text += f" ({target} stays allowed through its scope {scope}: revoke that too)"
    emit(args, row, text)
    return 0


def _mcp_scope_of(target: str) -> str | None:
    from worker.mcp.config import NAMESPACE_SEPARATOR, is_mcp_tool_name, mcp_scope

    if not is_mcp_tool_name(target):
        return None
    return mcp_scope(target.partition(NAMESPACE_SEPARATOR)[0])


async def _set_rate_limit(args: argparse.Namespace, settings: Settings) -> int:
    user = checked_name(args.user, "the user id")
    tool = _check_tool(args.tool)
    async with policy_store(settings) as store:
        row = await store.set_rate_limit(user, args.calls, tool=tool)
        await _warn_if_no_agent(store, user)
    what = f"{tool} calls" if tool else "calls of each tool"
    limit = "the default" if args.calls is None else f"{args.calls} per window"
    emit(args, row, f"user {user}: {what} limited to {limit}")
    return 0


async def _report(args: argparse.Namespace, settings: Settings) -> int:
    async with policy_store(settings) as store:
        report = await store.report(since=args.since)
    if args.json:
        print_json(report.to_json())
        return 0
    _print_report(report)
    return 0


def _print_report(report: PolicyReport) -> None:
    """``policy report`` for people: calls by mode, consumer, reason and tool, the flagged
    injection markers, and the log-only verdict."""
    print(
        f"policy decisions since {fmt(report.since)}: {report.calls} tool call(s), "
        f"{report.decided} decided by the gate"
    )
    if report.approvals:
        requested = sum(report.approvals.values())
        shown = ", ".join(
            f"{report.approvals[s]} {s}"
            for s in ("approved", "denied", "expired", "pending")
            if report.approvals.get(s)
        )
        print(f"  approvals: {requested} asked of a person ({visible_line(shown)})")
    if not report.decided:
        print("  (no decisions: the gate was off, or no tool calls ran in this period)")
        return
    _print_modes(report)
    _print_breakdowns(report)
    if report.injection_flags:
        flags = visible_line(
            ", ".join(f"{t}: {n}" for t, n in sorted(report.injection_flags.items()))
        )
        print(f"\n  injection markers flagged: {flags}")
    would_deny = report.would_deny_share
    if would_deny is not None:
        verdict = (
            "under the 1 % switch criterion: ready for enforce"
            if would_deny < ENFORCE_SWITCH_SHARE
            else "at or above the 1 % switch criterion: look at the reasons before enforcing"
        )
        print(
            f"\n  log-only: enforce would have denied {report.by_mode['log-only']['denied']} of "
            f"{report.by_mode['log-only']['calls']} calls ({would_deny:.2%}), {verdict}"
        )


def _print_modes(report: PolicyReport) -> None:
    """The table of calls by mode: allowed, denied (would-be in log-only), share, asked."""
    print(
        f"\n  {'MODE':<10} {'CALLS':>7} {'ALLOWED':>8} {'DENIED':>7} {'SHARE':>7} "
        f"{'ASKED':>6} {'FLAGGED':>8}"
    )
    for stored_mode, counts in report.by_mode.items():
        mode = visible_line(stored_mode)
        share = counts["denied"] / counts["calls"] if counts["calls"] else 0.0
        star = "*" if stored_mode == "log-only" else ""
        denied, asked = f"{counts['denied']}{star}", f"{counts.get('asked', 0)}{star}"
        print(
            f"  {mode:<10} {counts['calls']:>7} {counts['allowed']:>8} {denied:>7} "
            f"{share:>7.1%} {asked:>6} {counts['flagged']:>8}"
        )
    if "log-only" in report.by_mode:
        print("  * in log-only: would-be denials and asks (the calls ran)")


def _print_breakdowns(report: PolicyReport) -> None:
    """The decisions by consumer, by reason and by tool."""
    print("\n  by consumer (mission: missions' calls; mcp: MCP clients' calls):")
    for (consumer, mode), counts in sorted(report.by_consumer.items()):
        print(
            f"    {visible_line(consumer):<8} {visible_line(mode):<10} {counts['calls']:>7} "
            f"calls {counts['denied']:>6} denied {counts['flagged']:>6} flagged"
        )
    print("\n  by reason:")
    for (mode, reason), calls in sorted(report.by_reason.items()):
        print(f"    {visible_line(mode):<10} {visible_line(reason):<26} {calls:>7}")
    print("\n  by tool:")
    for (mode, tool), counts in sorted(report.by_tool.items()):
        print(
            f"    {visible_line(mode):<10} {visible_line(tool):<26} {counts['calls']:>7} calls "
            f"{counts['denied']:>6} denied"
        )
