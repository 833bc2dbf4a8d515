"""LangGraph's loop overhead, for ``bench/peers.py``: microseconds per round of the canonical
tool-calling graph (a model node, LangGraph's ``ToolNode``, ``tools_condition`` between them)
with an instant async chat model and async no-op tools.

Runs in the peers' own virtual environment (``bench/peers.py`` makes it), never in
mana-ai's: it imports nothing of mana-ai. Prints one JSON object:
``{"us_per_round": best, "runs": [...], "versions": {...}}``.

The model replays a script built before the clock starts (``rounds - 1`` replies that call
``tools`` no-op tools with other arguments every round, then an answer), as
``bench/loop_overhead.py`` does for mana-ai: what is timed is the graph's own work per round
(state updates, routing, the tool node's validation and calls, message objects), in CPU
time of the process (``time.process_time``), as ``bench/loop_overhead.py`` times mana-ai.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from importlib.metadata import version
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


class ReplayChatModel(BaseChatModel):
    """Replays ``replies`` one per call, asynchronously, at once."""

    replies: list[AIMessage]
    count: int = 0

    @property
    def _llm_type(self) -> str:
        return "replay"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        raise NotImplementedError("async only")

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        reply = self.replies[self.count]
        self.count += 1
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Any, **kw: Any) -> ReplayChatModel:
        return self


def noop_tool(i: int) -> StructuredTool:
    async def noop(text: str) -> dict[str, bool]:
        """Does nothing."""
        return {"ok": True}

    return StructuredTool.from_function(
        coroutine=noop, name=f"noop_{i}", description="Does nothing."
    )


def script(rounds: int, k: int) -> list[AIMessage]:
    calling = [
        AIMessage(
            content="",
            tool_calls=[
                {"id": f"call_{r}_{i}", "name": f"noop_{i}", "args": {"text": f"step {r}"}}
                for i in range(k)
            ],
        )
        for r in range(1, rounds)
    ]
    return [*calling, AIMessage(content="done")]


def graph(model: ReplayChatModel, tools: list[StructuredTool], checkpointer: Any = None) -> Any:
    bound = model.bind_tools(tools)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


async def measure(rounds: int, k: int, loops: int, repeat: int) -> list[float]:
    tools = [noop_tool(i) for i in range(k)]
    replies = script(rounds, k)

    async def one(model: ReplayChatModel, app: Any) -> None:
        result = await app.ainvoke(
            {"messages": [("system", "You are a benchmark."), ("user", "Go.")]},
            {"recursion_limit": 4 * rounds},
        )
        assert result["messages"][-1].content == "done", result["messages"][-1]

    warm = ReplayChatModel(replies=replies)
    await one(warm, graph(warm, tools))
    runs = []
    for _ in range(repeat):
        models = [ReplayChatModel(replies=replies) for _ in range(loops)]
        apps = [graph(m, tools) for m in models]  # compiled before the clock starts
        gc.collect()
        gc.freeze()
        started = time.process_time()
        for model, app in zip(models, apps, strict=True):
            await one(model, app)
        runs.append((time.process_time() - started) / (loops * rounds) * 1e6)
        gc.unfreeze()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tools", type=int, default=1)
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = asyncio.run(measure(args.rounds, args.tools, args.loops, args.repeat))
    versions = {name: version(name) for name in ("langgraph", "langchain-core")}
    print(json.dumps({"us_per_round": min(runs), "runs": runs, "versions": versions}))


if __name__ == "__main__":
    main()
