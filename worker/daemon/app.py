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
from worker.daemon.tools_setup import (
    check_policy_settings,
    mission_policy_setup,
    offered_tools,
    web_fetch_config,
)
from worker.daemon.worker import Worker
from worker.db.configured import (
    application_name,
    configured_engine,
    open_database,
    wait_for_database,
)
from worker.llm.chat_models import InstrumentedChatModel, build_chat_model, build_summariser
from worker.mcp.sources import McpToolSources
from worker.metrics import DB_POOLS, HealthState
from worker.policy_setup import PolicySetup, policy_config_from_settings
from worker.queries.user_policy import PolicyStore
from worker.run.compaction_setup import CompactionSetup
from worker.run.runner import MissionRunner
from worker.settings import Settings, otel_variables
from worker.store.base import MissionStore
from worker.store.postgres import PostgresMissionStore
from worker.store.records import ClaimedMission
from worker.tools import builtin_tool_catalog, builtin_tools

if TYPE_CHECKING:  # the MCP SDK is imported by the commands that need it
    from worker.admin.rerun import RerunConfig
    from worker.queries.missions import AdminStore
    from worker.queries.stored import StoredIteration
    from worker.tracing.hooks import RunTracing
    from worker.tracing.setup import Tracing

__all__ = [
    "App",
    "application_name",
    "chat_endpoints",
    "gate_lane",
    "gate_lane_size",
    "open_app",
    "open_database",
    "rerun_config",
    "wait_for_database",
    "watched_pools",
]

logger = logging.getLogger(__name__)


GATE_LANE_MIN_POOL = 4
"""From this ``MANA_AI_DB_POOL_SIZE`` on, one of the pool's connections is the policy gate's
own (``gate_lane``)."""


def gate_lane_size(settings: Settings) -> int:
    """Connections of the worker's pool that are the gate's own: 1 from ``GATE_LANE_MIN_POOL``
    on, else 0 (a small pool is shared)."""
    return 1 if settings.database.pool_size >= GATE_LANE_MIN_POOL else 0


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


@contextmanager
def watched_pools(settings: Settings, engine: AsyncEngine, gate: AsyncEngine) -> Iterator[None]:
    """Export the connection pools of ``engine`` (``main``) and, when it has its own,
    ``gate`` (``mana_ai_db_pool_*``, ``worker.metrics.DatabasePools``) while the block runs."""
    lane = gate_lane_size(settings)
    pools = {"main": (engine, settings.database.pool_size - lane + settings.database.max_overflow)}
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
        ("primary", settings.llm.primary.base_url),
        ("fallback", settings.llm.fallback.base_url),
        ("compaction", settings.llm.compaction.base_url),
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
            default_model=settings.llm.primary.model,
        ),
        summariser=TracedChatModel(
            summariser,
            tracing,
            provider=provider,
            endpoints=summariser_endpoints,
            default_model=settings.llm.primary.model,
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
    if settings.tracing.otel == "on":  # before the database: a missing [otel] is a settings error
        from worker.tracing.setup import open_tracing

        tracing = open_tracing(
            worker_id=settings.daemon.worker_id,
            capture_content=settings.tracing.capture_content,
            environ=otel_variables(),
        )
    try:
        wait_s = settings.database.start_wait_s if wait_s is None else wait_s
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
    pool_size = settings.database.pool_size - lane
    async with (
        open_database(settings, migrate=migrate, pool_size=pool_size, wait_s=wait_s) as engine,
        gate_lane(settings, engine) as ledger_engine,
    ):
        store = PostgresMissionStore(engine)
        tools = builtin_tools(engine, web=web_fetch_config(settings))
        chat = (
            InstrumentedChatModel(llm, default_model=settings.llm.primary.model)
            if llm is not None
            else build_chat_model(settings)
        )
        summariser = build_summariser(settings, chat)
        traced = None
        if tracing is not None:
            local = llm is None and not settings.llm.primary.base_url
            traced = _traced(settings, tracing, chat, summariser, local)

        lease = timedelta(seconds=settings.daemon.lease_s)
        policy = mission_policy_setup(settings, ledger_engine, tools)
        runner = _mission_runner(
            settings,
            store=store,
            tools=tools,
            chat=traced.chat if traced else chat,
            summariser=traced.summariser if traced else summariser,
            policy=policy,
            tracing=traced.runs if traced else None,
        )
        health = HealthState(stale_after_s=3 * settings.daemon.tick_interval_s + 30)
        worker = Worker(
            store=store,
            runner=runner,
            worker_id=settings.daemon.worker_id,
            max_concurrent_missions=settings.daemon.max_concurrent_missions,
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
                await policy.webhook.aclose(grace_s=settings.daemon.shutdown_grace_s)


def _mission_runner(
    settings: Settings,
    *,
    store: MissionStore,
    tools: Sequence[ToolSpec],
    chat: ChatModel,
    summariser: ChatModel,
    policy: PolicySetup,
    tracing: RunTracing | None,
) -> MissionRunner:
    """The runner of a worker's missions: its tools (as each agent may use them), the gate,
    reminders, compaction, MCP sources and timeouts, as the settings say."""

    def tools_for(mission: ClaimedMission) -> list[ToolSpec]:
        return offered_tools(tools, mission.allowed_tools, settings.policy.mission_scopes)

    return MissionRunner(
        store=store,
        llm=chat,
        tools_for=tools_for,
        worker_id=settings.daemon.worker_id,
        lease=timedelta(seconds=settings.daemon.lease_s),
        default_model=settings.llm.primary.model,
        policy=policy,
        reminders=settings.run.reminders == "on",
        reminders_disabled=settings.run.reminders_disabled,
        checkpoint_every=settings.run.checkpoint_every_rounds,
        reminder_role=settings.run.reminder_role,
        compaction=CompactionSetup(
            llm=summariser,
            max_ctx=settings.compaction.max_ctx,
            threshold=settings.compaction.threshold,
            max_per_iteration=settings.compaction.max_per_iteration,
            model=settings.llm.compaction.model,
            summariser_max_ctx=settings.compaction.model_max_ctx,
        ),
        max_parallel_reads=settings.run.max_parallel_reads,
        tool_timeout_s=settings.run.tool_timeout_s,
        tool_sources=McpToolSources(
            list_timeout_s=settings.mcp.list_timeout_s,
            max_result_chars=settings.mcp.max_result_chars,
            # past the loop's own tool timeout, whose message says more
            call_timeout_s=settings.run.tool_timeout_s + 5,
        ),
        tracing=tracing,
    )


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
    exposed = frozenset(settings.policy.mission_scopes) or None
    compact_max_ctx = agent.get("compact_max_ctx")
    return RerunConfig(
        tools=offered_tools(tools, agent["allowed_tools"], settings.policy.mission_scopes),
        max_rounds=agent["max_rounds"],
        policy_mode=PolicyMode(policy_mode or agent.get("policy_mode") or settings.policy.mode),
        policy_config=policy_config_from_settings(settings, exposed_scopes=exposed),
        user_settings=user_settings,
        user_id=agent["owner_user_id"],
        compact_max_ctx=compact_max_ctx
        if compact_max_ctx is not None
        else settings.compaction.max_ctx,
        compact_threshold=settings.compaction.threshold,
        compact_max_per_iteration=settings.compaction.max_per_iteration,
        compact_model=settings.llm.compaction.model,
        summariser_max_ctx=settings.compaction.model_max_ctx,
        reminders=settings.run.reminders == "on",
        reminders_disabled=frozenset(settings.run.reminders_disabled),
        reminder_role=settings.run.reminder_role,
        max_tokens_per_day=agent.get("max_tokens_per_day"),
        destructive=DestructivePolicy(
            agent.get("destructive_policy") or settings.policy.destructive
        ),
    )
