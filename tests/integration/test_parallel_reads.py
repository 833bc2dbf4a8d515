"""Parallel reads through the real worker: a mission whose round issues five web_fetch calls
(fake LLM server over HTTP, a local web server), and the stored log and tool_invocations in
source order whatever order the reads finished in (finished runs and interrupted ones)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, ToolContext, ToolSpec
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.fakes import FakeLLMServer, FakeWebServer, chat_completion_body
from tests.integration.test_tick import add_mission, iterations, make_worker
from worker.db.tables import tool_invocations
from worker.llm import OpenAICompatibleChatModel
from worker.tools import WebFetchConfig, clock_tools, web_tools

PAGE_LATENCY_S = 0.2


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def stored_calls(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(tool_invocations).order_by(tool_invocations.c.id))
        return [dict(r) for r in rows.mappings()]


async def test_five_web_fetches_in_one_round_overlap(db: AsyncEngine) -> None:
    web_tool = web_tools(WebFetchConfig(allow_private=True))  # the pages are on 127.0.0.1
    batches_before = metric("mana_ai_parallel_read_batches_total")
    timed_before = metric("mana_ai_tool_duration_seconds_count", tool="web_fetch")
    with FakeWebServer() as web, FakeLLMServer() as llm_server:
        for i in range(5):
            web.page(
                f"/page/{i}", f"<html><body><p>page {i}</p></body></html>", delay_s=PAGE_LATENCY_S
            )

        def five_fetches_then_answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            if any(m.get("role") == "tool" for m in body["messages"]):
                return 200, chat_completion_body(content="Read all five.")
            urls = [web.url(f"/page/{i}") for i in range(5)]
            return 200, chat_completion_body(tool_calls=[("web_fetch", {"url": u}) for u in urls])

        llm_server.responder = five_fetches_then_answer
        await add_mission(db, objective="Read the five pages.")
        async with OpenAICompatibleChatModel(base_url=llm_server.base_url, max_retries=0) as llm:
            worker = make_worker(db, llm, tools_for=lambda m: [*clock_tools(), *web_tool])
            assert await worker.run_once() == ["succeeded"]

    assert web.max_in_flight == 5, "all five requests were in flight at once"
    round_s = max(r.ended_s or 0.0 for r in web.requests) - min(r.started_s for r in web.requests)
    assert round_s < 3 * PAGE_LATENCY_S, f"the round took {round_s:.3f} s, not ~0.2 s"
    [it] = await iterations(db)
    tool_texts = [m["content"] for m in it["messages"] if m["role"] == "tool"]
    assert [f"page {i}" in text for i, text in enumerate(tool_texts)] == [True] * 5
    calls = await stored_calls(db)
    assert [c["arguments"]["url"].rsplit("/", 1)[1] for c in calls] == ["0", "1", "2", "3", "4"]
    assert all(c["outcome"] == "ok" for c in calls)
    assert metric("mana_ai_parallel_read_batches_total") == batches_before + 1
    assert metric("mana_ai_tool_duration_seconds_count", tool="web_fetch") == timed_before + 5


class ReverseReads:
    """A ``slow_read`` tool whose calls finish in the order ``finish_order`` says, then any
    call not in it waits forever (until cancelled). ``finished`` records completion order."""

    def __init__(self, count: int, finish_order: list[int]) -> None:
        self.count = count
        self.finish_order = finish_order
        self.finished: list[int] = []
        self.all_done = asyncio.Event()  # every call in finish_order finished
        self._changed = asyncio.Condition()
        self._started = 0

    async def handler(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, int]:
        i = int(args["i"])
        async with self._changed:
            self._started += 1
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self._started == self.count)
            if i not in self.finish_order:
                await self._changed.wait_for(lambda: False)  # until cancelled
            turn = self.finish_order.index(i)
            await self._changed.wait_for(lambda: len(self.finished) == turn)
            self.finished.append(i)
            if len(self.finished) == len(self.finish_order):
                self.all_done.set()
            self._changed.notify_all()
        return {"i": i}

    def spec(self) -> ToolSpec:
        schema = {"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]}
        return ToolSpec("slow_read", "Reads slowly.", schema, "read", self.handler)


def reads_then(answer: Callable[[CompletionRequest], CompletionResponse], count: int):  # type: ignore[no-untyped-def]
    def script(request: CompletionRequest) -> CompletionResponse:
        if any(m.role == "tool" for m in request.messages):
            return answer(request)
        return tool_calls(*[("slow_read", {"i": i}) for i in range(count)])

    return script


async def test_stored_log_and_invocations_are_in_source_order(db: AsyncEngine) -> None:
    reads = ReverseReads(4, finish_order=[3, 2, 1, 0])
    await add_mission(db)
    llm = FunctionChatModel(reads_then(lambda r: final_answer("done"), 4))
    worker = make_worker(db, llm, tools_for=lambda m: [reads.spec()])
    assert await worker.run_once() == ["succeeded"]

    assert reads.finished == [3, 2, 1, 0]
    [it] = await iterations(db)
    assistant = next(m for m in it["messages"] if m.get("tool_calls"))
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert [m["tool_call_id"] for m in it["messages"] if m["role"] == "tool"] == ids
    calls = await stored_calls(db)
    assert [c["call_id"] for c in calls] == ids
    assert [c["arguments"]["i"] for c in calls] == [0, 1, 2, 3]


async def test_an_interrupted_round_stores_its_finished_reads_in_source_order(
    db: AsyncEngine,
) -> None:
    reads = ReverseReads(4, finish_order=[3, 1])  # 0 and 2 never finish
    await add_mission(db)
    llm = FunctionChatModel(reads_then(lambda r: final_answer("unreachable"), 4))
    worker = make_worker(db, llm, tools_for=lambda m: [reads.spec()])
    [task] = await worker.tick()
    await reads.all_done.wait()
    await worker.drain(grace_s=0)
    assert task.cancelled()
    assert reads.finished == [3, 1]
    [it] = await iterations(db)
    assert it["stop_reason"] == "interrupted"
    calls = await stored_calls(db)
    assert [c["arguments"]["i"] for c in calls] == [1, 3]
