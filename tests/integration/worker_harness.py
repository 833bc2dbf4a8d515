"""A worker wired on the test database, and the missions it runs: shared by the integration
tests of the tick, the runner and the policy gate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ChatModel, CompletionRequest, CompletionResponse, ToolSpec
from planner.policy import PolicyConfig, PolicyMode
from planner.testing import final_answer, tool_calls
from worker.daemon.worker import Worker
from worker.db.tables import mission_iterations, missions
from worker.mcp.sources import McpToolSources
from worker.policy_setup import PolicySetup
from worker.queries.missions import AdminStore
from worker.run.compaction_setup import CompactionSetup
from worker.run.runner import MissionRunner, ToolsFactory
from worker.store.base import MissionStore
from worker.store.ledger import PostgresCallLedger
from worker.store.postgres import PostgresMissionStore
from worker.tools import builtin_tools

__all__ = [
    "LEASE",
    "add_mission",
    "clock_then_answer",
    "iterations",
    "make_worker",
    "mission_row",
    "objective_of",
    "policy_setup",
    "ticking",
    "tool_results",
]

LEASE = timedelta(seconds=30)


def clock_then_answer(request: CompletionRequest) -> CompletionResponse:
    """Call clock_now on the first round, answer once a tool result is in the log."""
    if any(m.role == "tool" for m in request.messages):
        return final_answer("It is late.")
    return tool_calls(("clock_now", {}))


def make_worker(
    engine: AsyncEngine,
    llm: ChatModel,
    *,
    worker_id: str = "w1",
    max_concurrent: int = 4,
    lease: timedelta = LEASE,
    extra_tools: list[ToolSpec] | None = None,
    store: MissionStore | None = None,
    tools_for: ToolsFactory | None = None,
    policy: PolicySetup | None = None,
    compaction: CompactionSetup | None = None,
    tool_sources: McpToolSources | None = None,
    clock: Callable[[], datetime] | None = None,
    tool_timeout_s: float | None = 60.0,
) -> Worker:
    """A worker on ``engine`` with the built-in tools (plus ``extra_tools``), the policy
    gate when ``policy`` is given (``policy_setup``), and agents' MCP servers opened by
    ``tool_sources`` (default: ``McpToolSources()``)."""
    store = store or PostgresMissionStore(engine)
    tools = [*builtin_tools(engine), *(extra_tools or [])]
    runner = MissionRunner(
        store=store,
        llm=llm,
        tools_for=tools_for or (lambda m: tools),
        worker_id=worker_id,
        lease=lease,
        policy=policy,
        compaction=compaction,
        tool_sources=tool_sources or McpToolSources(),
        tool_timeout_s=tool_timeout_s,
        **({"clock": clock} if clock is not None else {}),
    )
    return Worker(
        store=store,
        runner=runner,
        worker_id=worker_id,
        max_concurrent_missions=max_concurrent,
        lease=lease,
    )


def objective_of(request: CompletionRequest) -> str:
    """The mission's objective: the request's user message."""
    return next(m.content or "" for m in request.messages if m.role == "user")


def tool_results(request: CompletionRequest) -> list[str]:
    """The texts of the tool results the request carries, in order."""
    return [m.content or "" for m in request.messages if m.role == "tool"]


@asynccontextmanager
async def ticking(worker: Worker, interval_s: float = 3600) -> AsyncIterator[Worker]:
    """``worker`` ticking as the daemon has it tick (its job on a started APScheduler
    scheduler: a tick at once, then every ``interval_s`` and on each wake-up); on exit it
    stops claiming, drains its runs (10 s grace) and the scheduler shuts down."""
    scheduler = AsyncIOScheduler()
    worker.schedule(scheduler, interval_s)
    scheduler.start()
    try:
        yield worker
    finally:
        worker.stop()
        await worker.drain(10)
        scheduler.shutdown(wait=False)


async def add_mission(
    engine: AsyncEngine,
    *,
    cron: str | None = "0 * * * *",
    due_in: timedelta = timedelta(0),
    agent: str = "a1",
    objective: str = "What time is it?",
) -> int:
    admin = AdminStore(engine)
    try:
        agent_row = await admin.agent_by_name(agent)
    except Exception:
        agent_row = await admin.add_agent(name=agent, owner_user_id="u1", system_prompt="Be brief.")
    mission = await admin.add_mission(
        agent_id=agent_row["id"],
        objective=objective,
        cron=cron,
        timezone="UTC",
        next_run_at=datetime.now(UTC) + due_in,
    )
    return int(mission["id"])


async def iterations(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(mission_iterations).order_by(mission_iterations.c.id))
        return [dict(r) for r in rows.mappings()]


async def mission_row(engine: AsyncEngine, mission_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = await conn.execute(select(missions).where(missions.c.id == mission_id))
        return dict(row.mappings().one())


def policy_setup(
    engine: AsyncEngine, mode: PolicyMode = "enforce", config: PolicyConfig | None = None
) -> PolicySetup:
    """The mission runner's policy setup on ``engine`` (the PostgreSQL ledger)."""
    return PolicySetup(
        default_mode=mode, config=config or PolicyConfig(), ledger=PostgresCallLedger(engine)
    )
