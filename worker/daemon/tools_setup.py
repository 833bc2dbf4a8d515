"""The tools a consumer is offered and the policy gate over them, from the settings: for a
mission's run (``worker.daemon.app``) and for the MCP server's clients (``mana-ai mcp serve``)
alike."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from planner import DestructivePolicy, PolicyMode, ToolSpec
from worker.approval_webhook import ApprovalWebhook
from worker.db.configured import (
    open_database,
)
from worker.errors import SettingsError
from worker.mcp.config import is_mcp_scope, is_mcp_tool_name
from worker.policy_setup import PolicySetup, policy_config_from_settings
from worker.queries.user_policy import PolicyStore
from worker.settings import Settings
from worker.store.ledger import PostgresCallLedger
from worker.tools import OPT_IN_TOOLS, WebFetchConfig, builtin_tool_catalog, builtin_tools

if TYPE_CHECKING:  # the MCP SDK is imported by the commands that need it
    from worker.mcp.consumer import ServedTools
    from worker.queries.mcp_tokens import McpStore

__all__ = [
    "allowed_tools_for",
    "check_policy_settings",
    "mcp_policy_setup",
    "mission_policy_setup",
    "offered_tools",
    "open_served_tools",
    "web_fetch_config",
]

logger = logging.getLogger(__name__)


def allowed_tools_for(tools: Sequence[ToolSpec], allowed: Sequence[str] | None) -> list[ToolSpec]:
    """``tools`` restricted to the agent's allow-list, in registry order. ``None`` (no list)
    means every tool except the opt-in ones (``web_fetch``), which must be named."""
    if allowed is None:
        return [t for t in tools if t.name not in OPT_IN_TOOLS]
    wanted = set(allowed)
    return [t for t in tools if t.name in wanted]


def offered_tools(
    tools: Sequence[ToolSpec], allowed: Sequence[str] | None, scopes: Sequence[str]
) -> list[ToolSpec]:
    """The tools a mission's model is offered: the agent's allow-list (``allowed_tools_for``)
    within ``MANA_AI_POLICY_MISSION_SCOPES`` (``scopes``; empty: every scope). Tools outside
    those scopes are not offered; the gate still refuses them, should a model call one."""
    offered = allowed_tools_for(tools, allowed)
    return [t for t in offered if not scopes or t.scope in scopes]


def check_policy_settings(settings: Settings, tools: Sequence[ToolSpec]) -> None:
    """Refuse ``MANA_AI_POLICY_TOOL_RATE_LIMITS`` / ``MANA_AI_POLICY_MISSION_SCOPES`` /
    ``MANA_AI_MCP_SCOPES`` that name no tool or scope of ``tools`` (raises SettingsError with
    the known names). MCP servers' tools (``NAME__tool``) and scopes (``mcp:NAME``) are known
    only when a run lists them, so any well-formed such name is accepted for missions;
    ``mana-ai mcp serve`` exposes built-in tools only."""
    names = sorted({t.name for t in tools})
    scopes = sorted({t.scope for t in tools})
    problems = []
    unknown_tools = sorted(
        t for t in set(settings.policy.tool_rate_limits) - set(names) if not is_mcp_tool_name(t)
    )
    if unknown_tools:
        problems.append(
            f"MANA_AI_POLICY_TOOL_RATE_LIMITS: unknown tool(s) {', '.join(unknown_tools)}; "
            f"known: {', '.join(names)} (and MCP servers' tools, NAME__tool)"
        )
    unknown_scopes = sorted(
        s for s in set(settings.policy.mission_scopes) - set(scopes) if not is_mcp_scope(s)
    )
    if unknown_scopes:
        problems.append(
            f"MANA_AI_POLICY_MISSION_SCOPES: unknown scope(s) {', '.join(unknown_scopes)}; "
            f"known: {', '.join(scopes)} (and MCP servers' scopes, mcp:NAME)"
        )
    unknown_mcp = sorted(set(settings.mcp.scopes) - set(scopes))
    if unknown_mcp:
        problems.append(
            f"MANA_AI_MCP_SCOPES: unknown scope(s) {', '.join(unknown_mcp)}; "
            f"known: {', '.join(scopes)}"
        )
    if problems:
        raise SettingsError("\n".join(problems))


def mission_policy_setup(
    settings: Settings, engine: AsyncEngine, tools: Sequence[ToolSpec]
) -> PolicySetup:
    """The mission runner's policy gate setup: ``MANA_AI_POLICY_*`` with the ledger on
    ``engine``.

    Raises:
        SettingsError: a setting names a tool or scope that none of ``tools`` has (a typo
            would otherwise deny every call, or limit nothing).
    """
    check_policy_settings(settings, tools)
    exposed = frozenset(settings.policy.mission_scopes) or None
    return _policy_setup(settings, engine, "mission", exposed)


def mcp_policy_setup(
    settings: Settings, engine: AsyncEngine, tools: Sequence[ToolSpec]
) -> PolicySetup:
    """The MCP server's policy gate setup: the same ``MANA_AI_POLICY_*`` rules, ledger and
    mode as missions, consumer ``mcp``, exposing ``MANA_AI_MCP_SCOPES`` (unset: every scope).

    Raises:
        SettingsError: a setting names a tool or scope that none of ``tools`` has.
    """
    check_policy_settings(settings, tools)
    exposed = frozenset(settings.mcp.scopes) or None
    return _policy_setup(settings, engine, "mcp", exposed)


def _policy_setup(
    settings: Settings, engine: AsyncEngine, consumer: str, exposed: frozenset[str] | None
) -> PolicySetup:
    """``MANA_AI_POLICY_*`` and ``MANA_AI_APPROVAL_*`` for ``consumer``, the ledger on
    ``engine``, the tools of ``exposed`` scopes (``None``: every scope)."""
    webhook = None
    if settings.policy.approval_webhook_url is not None:
        webhook = ApprovalWebhook(
            settings.policy.approval_webhook_url, console_url=settings.api.console_url
        )
    return PolicySetup(
        default_mode=PolicyMode(settings.policy.mode),
        config=policy_config_from_settings(settings, exposed_scopes=exposed),
        ledger=PostgresCallLedger(engine),
        consumer=consumer,
        default_destructive=DestructivePolicy(settings.policy.destructive),
        approval_ttl=timedelta(seconds=settings.policy.approval_ttl_s),
        webhook=webhook,
    )


@asynccontextmanager
async def open_served_tools(
    settings: Settings, *, wait_s: float | None = None
) -> AsyncIterator[tuple[ServedTools, McpStore]]:
    """The tools ``mana-ai mcp serve`` offers (every built-in tool, behind the MCP consumer's
    gate) and the store of its tokens and calls, on the configured database, waited for up
    to ``wait_s`` seconds (``None``: ``MANA_AI_DB_START_WAIT_S``; ``open_database``).

    Raises:
        SettingsError: a policy setting names an unknown tool or scope (before the database
            is opened).
        ManaAIError: the database could not be opened (or is not migrated).
    """
    from worker.mcp.consumer import ServedTools
    from worker.queries.mcp_tokens import McpStore

    check_policy_settings(settings, builtin_tool_catalog())
    wait_s = settings.database.start_wait_s if wait_s is None else wait_s
    async with open_database(settings, wait_s=wait_s) as engine:
        tools = builtin_tools(engine, web=web_fetch_config(settings))
        store = McpStore(engine)
        policy = mcp_policy_setup(settings, engine, tools)
        served = ServedTools(
            tools=tools,
            policy=policy,
            store=store,
            user_settings=PolicyStore(engine).user_settings,
            tool_timeout_s=settings.run.tool_timeout_s,
        )
        try:
            yield served, store
        finally:
            if policy.webhook is not None:
                await policy.webhook.aclose(grace_s=settings.daemon.shutdown_grace_s)


def web_fetch_config(settings: Settings) -> WebFetchConfig:
    """The ``MANA_AI_WEB_*`` settings as web_fetch's configuration."""
    return WebFetchConfig(
        allow_private=settings.web.allow_private,
        allow_domains=settings.web.allow_domains,
        deny_domains=settings.web.deny_domains,
        timeout_s=settings.web.timeout_s,
        max_bytes=settings.web.max_bytes,
        max_chars=settings.web.max_chars,
        max_redirects=settings.web.max_redirects,
    )
