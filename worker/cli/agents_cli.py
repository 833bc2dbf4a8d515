"""``mana-ai agents``: an agent is a model, a system prompt, limits, tools, MCP servers and a
policy mode."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from worker.admin.agents import (
    DEFAULT_SYSTEM_PROMPT,
    DESTRUCTIVE_CHOICES,
    POLICY_MODE_CHOICES,
    budget,
    context_tokens,
    context_tokens_or_default,
    flag,
    max_rounds,
    max_tokens,
)
from worker.admin.values import INT32_MAX, MAX_ROUNDS
from worker.cli.args import UsageError, checked_name, group, json_flag
from worker.cli.output import emit, print_json, table
from worker.cli.stores import admin_store, read_only
from worker.terminal_text import visible_line

if TYPE_CHECKING:
    from worker.settings import Settings
    from worker.store.agent_servers import McpServerConfig

__all__ = ["DEFAULT_SYSTEM_PROMPT", "register"]

_UNSET = object()  # an option left out (``None`` is a value: 'none' / 'default')


def register(commands: Any) -> None:
    """Add ``agents add``, ``agents set`` and ``agents list``."""
    ag = group(
        commands, "agents", "Agents: a model, a system prompt, limits, tools and MCP servers."
    )
    _register_add(ag)
    _register_set(ag)
    lst = ag.add_parser("list", help="List agents.", description="List agents.")
    json_flag(lst)
    lst.set_defaults(command_fn=_list)


def _register_add(ag: Any) -> None:
    """``agents add``."""
    add = ag.add_parser("add", help="Create an agent.", description="Create an agent.")
    add.add_argument("--name", required=True, help="unique agent name")
    add.add_argument("--owner", required=True, help="owner user id; tools act in their space")
    add.add_argument("--system-prompt", default=DEFAULT_SYSTEM_PROMPT, help="agent instructions")
    add.add_argument("--model", help="model name (default: MANA_AI_LLM_MODEL / provider default)")
    add.add_argument(
        "--max-rounds", type=max_rounds, default=5, help=f"rounds per run, 1-{MAX_ROUNDS} (5)"
    )
    add.add_argument(
        "--max-tokens-per-day",
        type=max_tokens,
        help=f"daily token budget, 1-{INT32_MAX} (none by default)",
    )
    add.add_argument(
        "--tools",
        help="comma-separated tool names the agent may call (default: every built-in tool but "
        "web_fetch, which an agent gets only when --tools names it)",
    )
    add.add_argument(
        "--policy-mode",
        type=str.lower,
        choices=POLICY_MODE_CHOICES,
        help="the policy gate's mode for this agent's tool calls (default: MANA_AI_POLICY_MODE)",
    )
    add.add_argument(
        "--destructive",
        type=str.lower,
        choices=DESTRUCTIVE_CHOICES,
        help="a destructive call the owner has not opted in to, in enforce mode: deny it, or "
        "ask a person (`mana-ai approvals`) (default: MANA_AI_POLICY_DESTRUCTIVE)",
    )
    _mcp_options(add)
    add.add_argument(
        "--compact-max-ctx",
        type=context_tokens,
        help="the model's context in tokens, for compaction (0: never compact, else 256 or "
        "more; default MANA_AI_COMPACT_MAX_CTX)",
    )
    add.add_argument(
        "--if-not-exists",
        action="store_true",
        help="succeed without changes when an agent with this name exists",
    )
    json_flag(add)
    add.set_defaults(command_fn=_add)


def _register_set(ag: Any) -> None:
    """``agents set``."""
    set_ = ag.add_parser(
        "set",
        help="Change an agent.",
        description="Change an agent's settings; what is not given stays as it is. Missions "
        "running now keep the settings they started with.",
    )
    set_.add_argument("name", help="agent name")
    set_.add_argument("--system-prompt", help="agent instructions")
    set_.add_argument("--model", help="model name ('default': MANA_AI_LLM_MODEL)")
    set_.add_argument("--max-rounds", type=max_rounds, help=f"rounds per run, 1-{MAX_ROUNDS}")
    set_.add_argument(
        "--max-tokens-per-day",
        type=budget,
        default=_UNSET,
        help=f"daily token budget, 1-{INT32_MAX} ('none': no budget)",
    )
    set_.add_argument(
        "--tools",
        help="comma-separated tool names ('all': every built-in tool but web_fetch)",
    )
    set_.add_argument(
        "--policy-mode",
        type=str.lower,
        choices=(*POLICY_MODE_CHOICES, "default"),
        help="the policy gate's mode for this agent ('default': MANA_AI_POLICY_MODE)",
    )
    set_.add_argument(
        "--destructive",
        type=str.lower,
        choices=(*DESTRUCTIVE_CHOICES, "default"),
        help="deny or ask about destructive calls without opt-in ('default': "
        "MANA_AI_POLICY_DESTRUCTIVE); runs parked now keep waiting for their decision",
    )
    set_.add_argument(
        "--compact-max-ctx",
        type=context_tokens_or_default,
        default=_UNSET,
        help="the model's context in tokens, for compaction (0: never, else 256 or more; "
        "'default': MANA_AI_COMPACT_MAX_CTX)",
    )
    _mcp_options(set_)
    set_.add_argument(
        "--mcp-remove",
        action="append",
        metavar="NAME",
        default=[],
        help="remove the agent's MCP server NAME (repeatable)",
    )
    json_flag(set_)
    set_.set_defaults(command_fn=_set)


def _mcp_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mcp",
        action="append",
        nargs="+",
        default=[],
        metavar="NAME=URL|NAME=stdio:COMMAND ARGS",
        help="give the agent an MCP server's tools, as NAME__tool in scope mcp:NAME: "
        "streamable HTTP at URL, or a local process started with COMMAND ARGS (quote the "
        "whole value when an argument starts with '-'); replaces a server of that name "
        "(repeatable)",
    )
    parser.add_argument(
        "--mcp-header",
        action="append",
        default=[],
        metavar="NAME=HEADER:VALUE",
        help="an HTTP header sent to server NAME of this command's --mcp, e.g. "
        "'search=Authorization: Bearer TOKEN' (a secret: never logged nor printed)",
    )
    parser.add_argument(
        "--mcp-env",
        action="append",
        default=[],
        metavar="NAME=VAR=VALUE",
        help="an environment variable of stdio server NAME of this command's --mcp (a secret: "
        "never logged nor printed); it inherits only PATH, HOME, USER, LOGNAME, SHELL, TERM",
    )
    parser.add_argument(
        "--mcp-required",
        action="append",
        default=[],
        metavar="NAME",
        help="fail an iteration when server NAME of this command's --mcp cannot be used "
        "(default: the run goes on without its tools, and the iteration says why)",
    )


def _mcp_servers(args: argparse.Namespace) -> list[McpServerConfig]:
    """The servers of ``--mcp`` with their ``--mcp-header``, ``--mcp-env`` and
    ``--mcp-required`` (which must name a server of this command). Errors never echo a
    header or variable value."""
    import dataclasses

    from worker.mcp.config import parse_env_option, parse_header_option, parse_server_option

    servers: dict[str, McpServerConfig] = {}
    for words in args.mcp:
        try:
            server = parse_server_option(words[0], words[1:])
        except ValueError as exc:
            raise UsageError(f"--mcp: {exc}") from None
        if server.name in servers:
            raise UsageError(f"--mcp: server {server.name} is given twice")
        servers[server.name] = server

    def target(option: str, name: str, transport: str) -> McpServerConfig:
        if name not in servers:
            raise UsageError(
                f"{option} names server {name}, which this command's --mcp does not give; "
                f"give the server again (--mcp {name}=...) with all its options to change it"
            )
        server = servers[name]
        if transport and server.transport != transport:
            other = "--mcp-header" if server.transport == "http" else "--mcp-env"
            raise UsageError(f"{option} is for {transport} servers; {name} takes {other}")
        return server

    for text in args.mcp_header:
        try:
            name, header, value = parse_header_option(text)
        except ValueError as exc:
            raise UsageError(f"--mcp-header: {exc}") from None
        server = target("--mcp-header", name, "http")
        headers = {**server.headers, header: value}
        servers[name] = dataclasses.replace(server, headers=headers)
    for text in args.mcp_env:
        try:
            name, var, value = parse_env_option(text)
        except ValueError as exc:
            raise UsageError(f"--mcp-env: {exc}") from None
        server = target("--mcp-env", name, "stdio")
        servers[name] = dataclasses.replace(server, env={**server.env, var: value})
    for name in args.mcp_required:
        servers[name] = dataclasses.replace(
            target("--mcp-required", name.strip(), ""), required=True
        )
    return list(servers.values())


def _mcp_shown(servers: list[dict[str, Any]]) -> str:
    """``fs (stdio: npx), search (http: https://host/mcp, required)``, without secrets."""
    shown = []
    for s in servers:
        where = s["url"] if s["transport"] == "http" else s["command"]
        shown.append(
            f"{s['name']} ({s['transport']}: {where}{', required' if s['required'] else ''})"
        )
    return visible_line(", ".join(shown)) or "(none)"


def _shown(value: Any) -> str:
    if value is None:
        return "default"
    text = ",".join(value) if isinstance(value, list) else str(value)
    return repr(text[:60] + "…") if len(text) > 60 else visible_line(text)


async def _add(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.agents import AgentRequest, agent_or_none, create_agent
    from worker.tools import builtin_tool_catalog

    name = checked_name(args.name, "--name")
    request = AgentRequest(
        name=name,
        owner=args.owner,
        system_prompt=args.system_prompt,
        model=args.model,
        max_rounds=args.max_rounds,
        max_tokens_per_day=args.max_tokens_per_day,
        tools=args.tools,
        policy_mode=args.policy_mode,
        destructive=args.destructive,
        compact_max_ctx=args.compact_max_ctx,
        mcp_servers=_mcp_servers(args),
    )
    known = [t.name for t in builtin_tool_catalog()]
    async with admin_store(settings) as admin:
        if args.if_not_exists and (existing := await agent_or_none(admin, name)) is not None:
            emit(args, existing, f"agent {name} exists (id {existing['id']}); unchanged")
            return 0
        agent = await create_agent(admin, request, known)
    text = f"agent {visible_line(agent['name'])} created (id {agent['id']})"
    if request.mcp_servers:
        text += f"; MCP servers: {_mcp_shown(agent['mcp_servers'])}"
    emit(args, agent, text)
    return 0


async def _set(args: argparse.Namespace, settings: Settings) -> int:
    from worker.admin.agents import CHANGEABLE, AgentChanges, change_agent
    from worker.tools import builtin_tool_catalog

    given = {key: getattr(args, key) for key in CHANGEABLE}
    values = {
        key: value
        for key, value in given.items()
        if value is not _UNSET and (value is not None or key in _NONE_IS_A_VALUE)
    }
    changes = AgentChanges(
        values=values, mcp_servers=_mcp_servers(args), remove_mcp=args.mcp_remove
    )
    known = [t.name for t in builtin_tool_catalog()]
    async with admin_store(settings) as admin:
        agent, changed = await change_agent(admin, args.name, changes, known, _label)
    shown = [f"{key} {_shown(agent[key])}" for key in changed]
    if changes.mcp_servers or changes.remove_mcp:
        shown.append(f"MCP servers now {_mcp_shown(agent['mcp_servers'])}")
    emit(args, agent, f"agent {visible_line(agent['name'])} changed: {', '.join(shown)}")
    return 0


_NONE_IS_A_VALUE = frozenset({"max_tokens_per_day", "compact_max_ctx"})
"""Fields whose ``None`` was given ('none', 'default'), not left out (``_UNSET`` is)."""


def _label(field: str) -> str:
    """The flag of ``field``, as ``change_agent`` names it; the agent is the name argument."""
    return "the agent name" if field == "agent" else flag(field)


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    from worker.queries.reads import list_agents

    rows = await read_only(settings, list_agents)
    if args.json:
        print_json(rows)
    else:
        for row in rows:
            if row["policy_mode"] is None:
                row["policy_mode"] = f"default ({settings.policy.mode})"
            if row.get("destructive_policy") is None:
                row["destructive"] = f"default ({settings.policy.destructive})"
            else:
                row["destructive"] = row["destructive_policy"]
            row["mcp"] = ",".join(m["name"] for m in row["mcp_servers"]) or None
        table(
            rows,
            [
                "id",
                "name",
                "owner_user_id",
                "model",
                "max_rounds",
                "policy_mode",
                "destructive",
                "mcp",
                "allowed_tools",
            ],
        )
    return 0
