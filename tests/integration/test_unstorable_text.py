"""Text that PostgreSQL cannot hold (NUL, lone UTF-16 surrogates), sent by a model over real
HTTP as JSON escapes, in a call that parks for a person's approval: the request is stored, the
person can approve it, the resumed run runs exactly the call that was shown (the same text the
hash is bound to), once, and the model is asked once per round (no crash, no repeat).
Anywhere in the arguments: a value, a key, nested, in a list."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ToolContext, ToolSpec, arguments_hash
from tests.fakes import FakeLLMServer, chat_completion_body
from tests.integration.test_approvals import asking
from tests.integration.worker_harness import add_mission, iterations, make_worker
from worker.db.tables import approval_requests, tool_invocations
from worker.llm import OpenAICompatibleChatModel
from worker.queries.approval_requests import ApprovalStore

BAD = {
    "NUL in a value": {"text": "a\x00b"},
    "a lone high surrogate": {"text": "a\ud800b"},
    "a lone low surrogate": {"text": "\udfff"},
    "a reversed pair": {"text": "\udc00\ud800"},
    "in a key": {"k\x00ey": 1, "\ud83d": "x"},
    "nested in a list": {"items": [{"deep": ["ok", "\x00", "\ud800\x00"]}]},
}
"""Arguments as the model means them (sent over the wire as ``\\u0000`` / ``\\ud800``)."""

FFFD = "\ufffd"


def storable(value: Any) -> Any:
    """What the test expects stored and run: NUL and lone surrogates as U+FFFD."""
    if isinstance(value, str):
        return "".join(FFFD if c == "\x00" or "\ud800" <= c <= "\udfff" else c for c in value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


@pytest.mark.parametrize("arguments", BAD.values(), ids=BAD.keys())
async def test_a_parked_call_with_unstorable_text_is_approved_and_runs_once_as_shown(
    db: AsyncEngine, arguments: dict[str, Any]
) -> None:
    ran: list[dict[str, Any]] = []

    async def wipe(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(args)
        return "wiped"

    tool = ToolSpec(
        name="wipe",
        description="Wipe something.",
        input_schema={"type": "object"},
        policy_hint="destructive",
        handler=wipe,
    )

    def respond(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return 200, chat_completion_body(content="Done.")
        reply = chat_completion_body(content="Wiping \x00 it.", tool_calls=[("wipe", arguments)])
        return 200, reply

    with FakeLLMServer(respond) as server:
        llm = OpenAICompatibleChatModel(base_url=server.base_url, max_retries=0)
        try:
            await add_mission(db, cron=None, objective="Wipe it.")
            worker = make_worker(db, llm, extra_tools=[tool], policy=asking(db))
            assert await worker.run_once() == ["awaiting_approval"]
            [request] = await ApprovalStore(db).list_requests()
            expected = storable(arguments)
            assert request["arguments"] == expected
            digest = request["arguments_hash"]
            assert digest == arguments_hash(expected) == arguments_hash(arguments)
            decided = await ApprovalStore(db).decide(request["id"], approve=True, by="alice")
            assert decided["status"] == "approved"

            assert await worker.run_once() == ["succeeded"]
            assert ran == [expected]  # the call shown, run once
            assert len(server.requests) == 2  # one request per round: nothing ran twice
        finally:
            await llm.aclose()
    [it] = await iterations(db)
    assert (it["status"], it["error"]) == ("succeeded", None)
    async with db.connect() as conn:
        calls = (await conn.execute(select(tool_invocations))).mappings().all()
        stored = (await conn.execute(select(approval_requests))).mappings().one()
    assert [(c["tool"], c["outcome"], c["arguments"]) for c in calls] == [("wipe", "ok", expected)]
    assert stored["arguments"] == expected and stored["reply_text"] == f"Wiping {FFFD} it."
