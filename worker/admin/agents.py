"""Creating and changing agents: one set of rules for every way an admin does it (``mana-ai
agents add|set``, the HTTP API).

A request carries what was given, already typed (numbers parsed by ``worker.admin.values``);
``create_agent`` and ``change_agent`` check the names and texts (``worker.names``), the tool
list against the built-in tools, and the choices, then write. Messages name the flag or field
as the caller gave it (``Labels``: ``--max-rounds`` on the command line, ``max_rounds`` in the
API), so a refusal reads the same rule either way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.admin.values import INT32_MAX, MAX_ROUNDS, int_range
from worker.errors import NotFoundError, UsageError
from worker.names import checked_name, checked_text

if TYPE_CHECKING:  # the command line loads this module before it parses: keep it light
    from worker.queries.missions import AdminStore
    from worker.store.agent_servers import McpServerConfig

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DESTRUCTIVE_CHOICES",
    "POLICY_MODE_CHOICES",
    "AgentChanges",
    "AgentRequest",
    "Labels",
    "budget",
    "change_agent",
    "context_tokens",
    "context_tokens_or_default",
    "create_agent",
    "max_rounds",
    "max_tokens",
    "tool_list",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant that works through tools. Use the tools to complete the "
    "objective, then answer with a short summary of what you did."
)

POLICY_MODE_CHOICES = ("off", "log-only", "enforce")
DESTRUCTIVE_CHOICES = ("deny", "ask")

Labels = Callable[[str], str]
"""``field -> how the caller names it`` (``max_rounds`` -> ``--max-rounds``)."""


def flag(name: str) -> str:
    """The command line's label of field ``name``: ``--max-rounds``."""
    return "--" + name.replace("_", "-")


max_rounds = int_range(1, MAX_ROUNDS)
"""Rounds per run: 1 to ``MAX_ROUNDS``."""
max_tokens = int_range(1, INT32_MAX, "the largest budget the database holds")
"""A daily token budget: 1 to 2**31 - 1 (the database column)."""


def context_tokens(text: str) -> int:
    """A model's context for compaction: 0 (never compact) or 256 to 100,000,000 tokens."""
    from worker.settings.values import MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS  # pydantic: lazily

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, got {text!r}") from None
    if value != 0 and not MIN_CONTEXT_TOKENS <= value <= MAX_CONTEXT_TOKENS:
        raise argparse.ArgumentTypeError(
            f"expected 0 (never compact) or {MIN_CONTEXT_TOKENS} to {MAX_CONTEXT_TOKENS} tokens, "
            f"got {value}"
        )
    return value


def context_tokens_or_default(text: str) -> int | None:
    """``context_tokens``, or ``default`` (``None``: the daemon's setting)."""
    return None if text.strip().lower() == "default" else context_tokens(text)


def budget(text: str) -> int | None:
    """``max_tokens``, or ``none`` (``None``: no budget)."""
    return None if text.strip().lower() == "none" else max_tokens(text)


def tool_list(tools: str | Sequence[str], known: Sequence[str], what: str) -> list[str]:
    """The tools named (comma-separated text, or a list), each once, in order.

    Raises:
        UsageError: none named, or one that is not among ``known`` (the message lists them).
    """
    names: list[Any] = tools.split(",") if isinstance(tools, str) else list(tools)
    if not all(isinstance(t, str) for t in names):
        raise UsageError(f"{what} must name tools (text)")
    wanted = list(dict.fromkeys(t.strip() for t in names if t.strip()))
    if not wanted:
        raise UsageError(f"{what} names no tool; leave it out to allow every built-in tool")
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise UsageError(f"unknown tool(s) {', '.join(unknown)}; available: {', '.join(known)}")
    return wanted


def _choice(value: str | None, choices: Sequence[str], what: str) -> str | None:
    if value is None:
        return None
    if value not in choices:
        raise UsageError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value


@dataclass(frozen=True)
class AgentRequest:
    """A new agent, as given (numbers typed and in range; see the module docstring).

    Attributes:
        tools: the built-in tools it may call (``None``: all but the opt-in ones).
        policy_mode, destructive: its overrides (``None``: the daemon's settings).
        compact_max_ctx: its model's context (``None``: ``MANA_AI_COMPACT_MAX_CTX``).
        mcp_servers: its MCP servers (the command line's ``--mcp``).
    """

    name: str
    owner: str
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    model: str | None = None
    max_rounds: int = 5
    max_tokens_per_day: int | None = None
    tools: str | Sequence[str] | None = None
    policy_mode: str | None = None
    destructive: str | None = None
    compact_max_ctx: int | None = None
    mcp_servers: Sequence[McpServerConfig] = ()


async def create_agent(
    admin: AdminStore, request: AgentRequest, known_tools: Sequence[str], labels: Labels = flag
) -> dict[str, Any]:
    """Check ``request`` (see the module docstring) and create the agent.

    Raises:
        UsageError: a name, text, tool or choice is refused (nothing is written).
        ConflictError: an agent of that name exists.
    """
    name = checked_name(request.name, labels("name"))
    owner = checked_name(request.owner, labels("owner"))
    system_prompt = checked_text(request.system_prompt, labels("system_prompt"))
    model = None if request.model is None else checked_name(request.model, labels("model"))
    tools = None
    if request.tools is not None:
        tools = tool_list(request.tools, known_tools, labels("tools"))
    return await admin.add_agent(
        name=name,
        owner_user_id=owner,
        system_prompt=system_prompt,
        model=model,
        max_rounds=request.max_rounds,
        max_tokens_per_day=request.max_tokens_per_day,
        allowed_tools=tools,
        policy_mode=_choice(request.policy_mode, POLICY_MODE_CHOICES, labels("policy_mode")),
        destructive_policy=_choice(request.destructive, DESTRUCTIVE_CHOICES, labels("destructive")),
        compact_max_ctx=request.compact_max_ctx,
        mcp_servers=request.mcp_servers,
    )


@dataclass(frozen=True)
class AgentChanges:
    """What to change in an agent: only the fields in ``values`` (``None`` there: back to the
    default — the daemon's model, mode or context, no budget, every built-in tool), and MCP
    servers to add or replace (``mcp_servers``) or remove (``remove_mcp``)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    mcp_servers: Sequence[McpServerConfig] = ()
    remove_mcp: Sequence[str] = ()


CHANGEABLE = (
    "system_prompt",
    "model",
    "max_rounds",
    "max_tokens_per_day",
    "tools",
    "policy_mode",
    "destructive",
    "compact_max_ctx",
)
"""The fields ``change_agent`` takes in ``AgentChanges.values``."""


async def change_agent(
    admin: AdminStore,
    name: str,
    changes: AgentChanges,
    known_tools: Sequence[str],
    labels: Labels = flag,
) -> tuple[dict[str, Any], list[str]]:
    """Check ``changes`` and apply them to the agent called ``name``; the agent after the
    change and the columns changed.

    Raises:
        UsageError: nothing to change, a refused value, or a server both added and removed.
        NotFoundError: no such agent (or no such MCP server to remove); nothing is changed.
    """
    name = checked_name(name, labels("agent"))
    unknown = sorted(set(changes.values) - set(CHANGEABLE))
    if unknown:
        raise UsageError(f"cannot change {', '.join(unknown)}; changeable: {', '.join(CHANGEABLE)}")
    columns: dict[str, Any] = {}
    for key, value in changes.values.items():
        what = labels(key)
        if key == "system_prompt":
            columns[key] = checked_text(_text(value, what), what)
        elif key == "model":
            model = None if value is None else checked_name(_text(value, what), what)
            columns[key] = None if model is None or model.lower() == "default" else model
        elif key == "tools":
            columns["allowed_tools"] = (
                None
                if value is None or (isinstance(value, str) and value.strip().lower() == "all")
                else tool_list(value, known_tools, what)
            )
        elif key == "policy_mode":
            columns[key] = (
                None if value in (None, "default") else _choice(value, POLICY_MODE_CHOICES, what)
            )
        elif key == "destructive":
            columns["destructive_policy"] = (
                None if value in (None, "default") else _choice(value, DESTRUCTIVE_CHOICES, what)
            )
        else:  # numbers: typed and checked by the caller's parser
            columns[key] = value
    remove = list(dict.fromkeys(n.strip() for n in changes.remove_mcp))
    clash = sorted({s.name for s in changes.mcp_servers} & set(remove))
    if clash:
        raise UsageError(f"{labels('mcp')} and {labels('mcp_remove')} both name {', '.join(clash)}")
    if not columns and not changes.mcp_servers and not remove:
        raise UsageError("nothing to change: give at least one option (see --help)")
    agent = await admin.update_agent(
        name, mcp_servers=changes.mcp_servers, remove_mcp=remove, **columns
    )
    return agent, sorted(columns)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text")
    return value


async def agent_or_none(admin: AdminStore, name: str) -> dict[str, Any] | None:
    """The agent called ``name``, or ``None``."""
    try:
        return await admin.agent_by_name(name)
    except NotFoundError:
        return None
