"""The composition root: Settings → engine, store, tools, chat model, runner, worker.

Nothing below this module reads settings; they receive explicit, typed configuration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ChatModel, DestructivePolicy, PolicyMode, ToolSpec
from worker.approval_webhook import ApprovalWebhook
from worker.daemon.worker import Worker
from worker.errors import SettingsError
from worker.llm.chat_models import InstrumentedChatModel, build_chat_model, build_summariser
from worker.mcp.config import is_mcp_scope, is_mcp_tool_name
from worker.mcp.sources import McpToolSources
from worker.metrics import DB_POOLS, HealthState
from worker.policy_setup import PolicySetup, policy_config_from_settings
from worker.run.compaction_setup import CompactionSetup
from worker.run.runner import MissionRunner
from worker.settings import Settings, otel_variables
from worker.store.base import MissionStore
from worker.store.database import (
    application_name,
    configured_engine,
    open_database,
    wait_for_database,
)
from worker.store.ledger import PostgresCallLedger
from worker.store.postgres import PostgresMissionStore
from worker.store.records import ClaimedMission
from worker.store.user_policy import PolicyStore
from worker.tools import OPT_IN_TOOLS, WebFetchConfig, builtin_tool_catalog, builtin_tools

if TYPE_CHECKING:  # the MCP SDK is imported by the commands that need it
    from worker.admin.rerun import RerunConfig
    from worker.mcp.consumer import ServedTools
    from worker.store.admin import AdminStore
    from worker.store.mcp_tokens import McpStore
    from worker.store.stored import StoredIteration
    from worker.tracing.hooks import RunTracing
    from worker.tracing.setup import Tracing

__all__ = [
    "App",
    "allowed_tools_for",
    "application_name",
    "chat_endpoints",
    "check_policy_settings",
    "gate_lane",
    "gate_lane_size",
    "mcp_policy_setup",
    "mission_policy_setup",
    "offered_tools",
    "open_app",
    "open_database",
    "open_served_tools",
    "rerun_config",
    "wait_for_database",
    "watched_pools",
    "web_fetch_config",
]

logger = logging.getLogger(__name__)


GATE_LANE_MIN_POOL = 4
"""From this ``MANA_AI_DB_POOL_SIZE`` on, one of the pool's connections is the policy gate's
own (``gate_lane``)."""


def gate_lane_size(settings: Settings) -> int:
    """Connections of the worker's pool that are the gate's own: 1 from ``GATE_LANE_MIN_POOL``
    on, else 0 (a small pool is shared)."""
    return 1 if settings.db_pool_size >= GATE_LANE_MIN_POOL else 0


@asynccontextmanager
async def gate_lane(settings: Settings, engine: AsyncEngine) -> AsyncIterator[AsyncEngine]:
    """The engine the policy gate's ledger uses: a connection of its own to the database of
    ``engine`` when ``gate_lane_size`` says so (its reservations never wait behind the
    missions' statements for a pooled connection, however many missions run), else
    ``engine`` itself. Disposed on exit."""
    if not gate_lane_size(settings):
        yield engine
        return
    lane = configured_engine(settings, engine.url.render_as_string(hide_password=False))
    try:
        yield lane
    finally:
        await lane.dispose()


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
        t for t in set(settings.policy_tool_rate_limits) - set(names) if not is_mcp_tool_name(t)
    )
    if unknown_tools:
        problems.append(
            f"MANA_AI_POLICY_TOOL_RATE_LIMITS: unknown tool(s) {', '.join(unknown_tools)}; "
            f"known: {', '.join(names)} (and MCP servers' tools, NAME__tool)"
        )
    unknown_scopes = sorted(
        s for s in set(settings.policy_mission_scopes) - set(scopes) if not is_mcp_scope(s)
    )
    if unknown_scopes:
        problems.append(
            f"MANA_AI_POLICY_MISSION_SCOPES: unknown scope(s) {', '.join(unknown_scopes)}; "
            f"known: {', '.join(scopes)} (and MCP servers' scopes, mcp:NAME)"
        )
    unknown_mcp = sorted(set(settings.mcp_scopes) - set(scopes))
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
    exposed = frozenset(settings.policy_mission_scopes) or None
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
    exposed = frozenset(settings.mcp_scopes) or None
    return _policy_setup(settings, engine, "mcp", exposed)


def _policy_setup(
    settings: Settings, engine: AsyncEngine, consumer: str, exposed: frozenset[str] | None
) -> PolicySetup:
    """``MANA_AI_POLICY_*`` and ``MANA_AI_APPROVAL_*`` for ``consumer``, the ledger on
    ``engine``, the tools of ``exposed`` scopes (``None``: every scope)."""
    webhook = None
    if settings.approval_webhook_url is not None:
        webhook = ApprovalWebhook(settings.approval_webhook_url, console_url=settings.console_url)
    return PolicySetup(
        default_mode=PolicyMode(settings.policy_mode),
        config=policy_config_from_settings(settings, exposed_scopes=exposed),
        ledger=PostgresCallLedger(engine),
        consumer=consumer,
        default_destructive=DestructivePolicy(settings.policy_destructive),
        approval_ttl=timedelta(seconds=settings.approval_ttl_s),
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
    from worker.store.mcp_tokens import McpStore

    check_policy_settings(settings, builtin_tool_catalog())
    wait_s = settings.db_start_wait_s if wait_s is None else wait_s
    async with open_database(settings, wait_s=wait_s) as engine:
        tools = builtin_tools(engine, web=web_fetch_config(settings))
        store = McpStore(engine)
        policy = mcp_policy_setup(settings, engine, tools)
        served = ServedTools(
            tools=tools,
            policy=policy,
            store=store,
            user_settings=PolicyStore(engine).user_settings,
            tool_timeout_s=settings.tool_timeout_s,
        )
        try:
            yield served, store
        finally:
            if policy.webhook is not None:
                await policy.webhook.aclose(grace_s=settings.shutdown_grace_s)


def web_fetch_config(settings: Settings) -> WebFetchConfig:
    """The ``MANA_AI_WEB_*`` settings as web_fetch's configuration."""
    return WebFetchConfig(
        allow_private=settings.web_allow_private,
        allow_domains=settings.web_allow_domains,
        deny_domains=settings.web_deny_domains,
        timeout_s=settings.web_timeout_s,
        max_bytes=settings.web_max_bytes,
        max_chars=settings.web_max_chars,
        max_redirects=settings.web_max_redirects,
    )


@contextmanager
def watched_pools(settings: Settings, engine: AsyncEngine, gate: AsyncEngine) -> Iterator[None]:
    """Export the connection pools of ``engine`` (``main``) and, when it has its own,
    ``gate`` (``mana_ai_db_pool_*``, ``worker.metrics.DatabasePools``) while the block runs."""
    lane = gate_lane_size(settings)
    pools = {"main": (engine, settings.db_pool_size - lane + settings.db_max_overflow)}
    if gate is not engine:
        pools["gate"] = (gate, lane)
    for name, (watched, most) in pools.items():
        DB_POOLS.watch(name, _pool_reader(watched.pool), most)
    try:
        yield
    finally:
        for name in pools:
            DB_POOLS.forget(name)


def _pool_reader(pool: Any) -> Callable[[], tuple[int, int]]:
    """``() -> (used, idle)`` of a SQLAlchemy ``QueuePool``."""
    return lambda: (pool.checkedout(), pool.checkedin())


def chat_endpoints(settings: Settings) -> dict[str, tuple[str, int]]:
    """``(host, port)`` of the configured LLM endpoints by name (``primary``, ``fallback``,
    ``compaction``; the embedded model has none), the ``server.*`` attributes of traces."""
    import httpx

    endpoints = {}
    for name, url in (
        ("primary", settings.llm_base_url),
        ("fallback", settings.llm_fallback_base_url),
        ("compaction", settings.compact_base_url),
    ):
        if url:
            parsed = httpx.URL(url)
            default_port = 443 if parsed.scheme == "https" else 80
            endpoints[name] = (parsed.host, parsed.port or default_port)
    return endpoints


@dataclass
class _Traced:
    """What tracing adds to an app: the runner's tracer and the wrapped chat models."""

    tracing: Tracing
    runs: RunTracing
    chat: ChatModel
    summariser: ChatModel


def _traced(
    settings: Settings, tracing: Tracing, chat: ChatModel, summariser: ChatModel, local: bool
) -> _Traced:
    from worker.tracing.chat_spans import TracedChatModel
    from worker.tracing.run_spans import RunTracer

    provider = "_OTHER" if local else "openai"
    endpoints = chat_endpoints(settings)
    mission_endpoints = {k: v for k, v in endpoints.items() if k != "compaction"}
    summariser_endpoints = (
        {"compaction": endpoints["compaction"]} if "compaction" in endpoints else mission_endpoints
    )
    return _Traced(
        tracing=tracing,
        runs=RunTracer(tracing, provider=provider),
        chat=TracedChatModel(
            chat,
            tracing,
            provider=provider,
            endpoints=mission_endpoints,
            default_model=settings.llm_model,
        ),
        summariser=TracedChatModel(
            summariser,
            tracing,
            provider=provider,
            endpoints=summariser_endpoints,
            default_model=settings.llm_model,
            summariser=True,
        ),
    )


@dataclass
class App:
    """The wired worker and what it owns."""

    engine: AsyncEngine
    store: MissionStore
    llm: InstrumentedChatModel
    worker: Worker
    health: HealthState


@asynccontextmanager
async def open_app(
    settings: Settings,
    *,
    llm: ChatModel | None = None,
    migrate: bool | None = None,
    wait_s: float | None = None,
) -> AsyncIterator[App]:
    """Wire a Worker from ``settings``; ``llm`` overrides the configured chat model. The
    database is waited for up to ``wait_s`` seconds (``None``: ``MANA_AI_DB_START_WAIT_S``):
    each round trip of its opening that fails for a transient fault is tried again until
    then (``open_database``).

    Raises:
        SettingsError: a policy setting names an unknown tool or scope (before the database
            is opened).
        ManaAIError: the database could not be opened or migrated.
    """
    check_policy_settings(settings, builtin_tool_catalog())
    tracing: Tracing | None = None
    if settings.otel == "on":  # before the database: a missing [otel] is a settings error
        from worker.tracing.setup import open_tracing

        tracing = open_tracing(
            worker_id=settings.worker_id,
            capture_content=settings.otel_capture_content,
            environ=otel_variables(),
        )
    try:
        wait_s = settings.db_start_wait_s if wait_s is None else wait_s
        async with _wired_app(
            settings, llm=llm, migrate=migrate, wait_s=wait_s, tracing=tracing
        ) as app:
            yield app
    finally:
        if tracing is not None:  # what is buffered goes out (off the loop: it may wait)
            await asyncio.to_thread(tracing.shutdown)


@asynccontextmanager
async def _wired_app(
    settings: Settings,
    *,
    llm: ChatModel | None,
    migrate: bool | None,
    wait_s: float,
    tracing: Tracing | None,
) -> AsyncIterator[App]:
    lane = gate_lane_size(settings)
    pool_size = settings.db_pool_size - lane
    async with (
        open_database(settings, migrate=migrate, pool_size=pool_size, wait_s=wait_s) as engine,
        gate_lane(settings, engine) as ledger_engine,
    ):
        store = PostgresMissionStore(engine)
        tools = builtin_tools(engine, web=web_fetch_config(settings))
        chat = (
            InstrumentedChatModel(llm, default_model=settings.llm_model)
            if llm is not None
            else build_chat_model(settings)
        )
        summariser = build_summariser(settings, chat)
        traced = None
        if tracing is not None:
            local = llm is None and not settings.llm_base_url
            traced = _traced(settings, tracing, chat, summariser, local)

        def tools_for(mission: ClaimedMission) -> list[ToolSpec]:
            return offered_tools(tools, mission.allowed_tools, settings.policy_mission_scopes)

        lease = timedelta(seconds=settings.lease_s)
        policy = mission_policy_setup(settings, ledger_engine, tools)
        runner = MissionRunner(
            store=store,
            llm=traced.chat if traced else chat,
            tools_for=tools_for,
            worker_id=settings.worker_id,
            lease=lease,
            default_model=settings.llm_model,
            policy=policy,
            reminders=settings.reminders == "on",
            reminders_disabled=settings.reminders_disabled,
            checkpoint_every=settings.checkpoint_every_rounds,
            reminder_role=settings.reminder_role,
            compaction=CompactionSetup(
                llm=traced.summariser if traced else summariser,
                max_ctx=settings.compact_max_ctx,
                threshold=settings.compact_threshold,
                max_per_iteration=settings.compact_max_per_iteration,
                model=settings.compact_model,
                summariser_max_ctx=settings.compact_model_max_ctx,
            ),
            max_parallel_reads=settings.max_parallel_reads,
            tool_timeout_s=settings.tool_timeout_s,
            tool_sources=McpToolSources(
                list_timeout_s=settings.mcp_list_timeout_s,
                max_result_chars=settings.mcp_max_result_chars,
                # past the loop's own tool timeout, whose message says more
                call_timeout_s=settings.tool_timeout_s + 5,
            ),
            tracing=traced.runs if traced else None,
        )
        health = HealthState(stale_after_s=3 * settings.tick_interval_s + 30)
        worker = Worker(
            store=store,
            runner=runner,
            worker_id=settings.worker_id,
            max_concurrent_missions=settings.max_concurrent_missions,
            lease=lease,
            health=health,
        )
        try:
            with watched_pools(settings, engine, ledger_engine):
                yield App(engine, store, chat, worker, health)
        finally:
            await chat.aclose()
            if summariser is not chat:
                await summariser.aclose()
            if policy.webhook is not None:
                await policy.webhook.aclose(grace_s=settings.shutdown_grace_s)


async def rerun_config(
    admin: AdminStore, settings: Settings, iteration: StoredIteration, policy_mode: str | None
) -> RerunConfig:
    """What ``replay --rerun`` (and the API's rerun) runs ``iteration`` under: today's
    settings for the iteration's agent (the mission's agent as it is now), in
    ``policy_mode`` when given (else the agent's, else ``MANA_AI_POLICY_MODE``).

    Raises:
        SettingsError: a policy setting names an unknown tool or scope (a typo would mislead
            the report).
        NotFoundError: the iteration's mission no longer exists.
    """
    from worker.admin.rerun import RerunConfig

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
        policy_mode=PolicyMode(policy_mode or agent.get("policy_mode") or settings.policy_mode),
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
