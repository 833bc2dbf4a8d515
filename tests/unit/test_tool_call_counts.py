"""``mana_ai_tool_calls_total`` takes bounded ``tool`` values: a built-in tool's name, one
``SERVER__*`` per MCP server whatever names the server lists, ``(unknown)`` for a name the model
invented."""

from __future__ import annotations

from prometheus_client import REGISTRY

from planner.calls import ExecutedCall
from planner.messages import ToolCall
from planner.record import RunRecord
from worker.run.run_metrics import count_calls


def calls_of(tool: str) -> float:
    return (
        REGISTRY.get_sample_value("mana_ai_tool_calls_total", {"tool": tool, "outcome": "ok"})
        or 0.0
    )


def test_an_mcp_servers_tools_share_one_label() -> None:
    names = ["clock_now", "srv__made_up_1", "srv__made_up_2", "invented"]
    before = {t: calls_of(t) for t in ("clock_now", "srv__*", "(unknown)")}
    record = RunRecord(
        calls=tuple(
            ExecutedCall(1, ToolCall(id=str(i), name=name), {"ok": True}, None, None, 1.0, i)
            for i, name in enumerate(names)
        )
    )
    count_calls(record, tool_names={"clock_now", "srv__made_up_1", "srv__made_up_2"})
    assert calls_of("clock_now") - before["clock_now"] == 1
    assert calls_of("srv__*") - before["srv__*"] == 2
    assert calls_of("(unknown)") - before["(unknown)"] == 1
    assert calls_of("srv__made_up_1") == 0
