"""What a reviewer sees of a parked call (issue 31, item 13): the tool's read-back of what
the call would act on (``ToolSpec.describe``: a note's title), stored with the request when the
gate asks, and the agent and the mission's objective, on the console's card, in the API and in
``mana-ai approvals list|show``. A tool's read-back that fails or hangs never stops the
request; a tool without one says nothing."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, ToolContext, ToolSpec
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.api_harness import api_client, token
from tests.integration.test_approvals import asking
from tests.integration.test_cli_approvals import cli
from tests.integration.test_console import signed_in
from tests.integration.worker_harness import add_mission, make_worker
from worker.queries.approval_requests import ApprovalStore
from worker.tools import builtin_tools

OBJECTIVE = "Tidy up the notes of the quarter."


async def titled_note(db: AsyncEngine, title: str, body: str = "x" * 412) -> int:
    create = {t.name: t for t in builtin_tools(db)}["notes_create"]
    made = await create.handler({"title": title, "body": body}, ToolContext(user_id="u1"))
    return int(made["id"])


def calling(name: str, arguments: dict[str, Any]) -> FunctionChatModel:
    def answer(request: CompletionRequest) -> CompletionResponse:
        if any(m.role == "tool" for m in request.messages):
            return final_answer("Done.")
        return tool_calls((name, arguments), text="Cleaning up.")

    return FunctionChatModel(answer)


async def parked(db: AsyncEngine, model: FunctionChatModel, **worker: Any) -> dict[str, Any]:
    await add_mission(db, cron=None, objective=OBJECTIVE, agent="tidier")
    assert await make_worker(db, model, policy=asking(db), **worker).run_once() == [
        "awaiting_approval"
    ]
    [request] = await ApprovalStore(db).list_requests(status="pending")
    return request


async def test_a_delete_card_says_which_note_whose_agent_and_what_mission(
    db: AsyncEngine, database_url: str, run: Any
) -> None:
    note_id = await titled_note(db, "Q3 plan")
    request = await parked(db, calling("notes_delete", {"id": note_id}))
    assert request["target"].startswith(f"note {note_id} 'Q3 plan' (a body of 412 characters")
    assert request["agent"] == "tidier" and request["objective"] == OBJECTIVE
    async with api_client(db, database_url, bearer=await token(db, "api")) as client:
        [listed] = (await client.get("/api/v1/approvals")).json()["approvals"]
        shown = (await client.get(f"/api/v1/approvals/{request['id']}")).json()
        for row in (listed, shown):
            assert "Q3 plan" in row["target"] and row["objective"] == OBJECTIVE
            assert row["agent"] == "tidier"
        await signed_in(client, await token(db))
        card = (await client.get("/approvals")).text
        assert "Q3 plan" in card and OBJECTIVE in card and "tidier" in card
        assert "Acts on" in card
    code, out, _ = await cli(run, "approvals", "list")
    assert code == 0 and "TARGET" in out and "Q3 plan" in out
    code, out, _ = await cli(run, "approvals", "show", str(request["id"]))
    assert code == 0 and "acts on: note" in out and "Q3 plan" in out and OBJECTIVE in out
    code, out, _ = await cli(run, "approvals", "list", "--json")
    assert "Q3 plan" in json.loads(out)[0]["target"]


def bucket_tool(describe: Any) -> ToolSpec:
    async def drop(args: dict[str, Any], ctx: ToolContext) -> str:
        return "dropped"

    return ToolSpec(
        name="bucket_drop",
        description="Drop a bucket.",
        input_schema={"type": "object", "properties": {"bucket": {"type": "string"}}},
        policy_hint="destructive",
        scope="buckets",
        handler=drop,
        describe=describe,
    )


async def test_any_tool_may_describe_its_target_and_a_failing_read_back_never_stops_a_request(
    db: AsyncEngine,
) -> None:
    async def said(args: dict[str, Any], ctx: ToolContext) -> str:
        return f"bucket {args['bucket']} of {ctx.user_id}: 1,204 objects, 3.1 GB"

    request = await parked(
        db, calling("bucket_drop", {"bucket": "b1"}), extra_tools=[bucket_tool(said)]
    )
    assert request["target"] == "bucket b1 of u1: 1,204 objects, 3.1 GB"


async def test_a_read_back_that_fails_says_so_and_the_request_is_made(db: AsyncEngine) -> None:
    async def broken(args: dict[str, Any], ctx: ToolContext) -> str:
        raise ConnectionError("storage is away")

    request = await parked(
        db, calling("bucket_drop", {"bucket": "b1"}), extra_tools=[bucket_tool(broken)]
    )
    assert "could not say what this call acts on" in request["target"]
    assert "ConnectionError" in request["target"]


async def test_a_tool_without_a_read_back_says_nothing(db: AsyncEngine) -> None:
    request = await parked(
        db, calling("bucket_drop", {"bucket": "b1"}), extra_tools=[bucket_tool(None)]
    )
    assert request["target"] is None


async def test_an_approved_call_whose_target_changed_since_is_not_run(db: AsyncEngine) -> None:
    # a person approved deleting note 'Q3 plan'; the note was edited before the run resumed:
    # the approval was for what they saw, so the call is refused and the note stays
    note_id = await titled_note(db, "Q3 plan")
    model = calling("notes_delete", {"id": note_id})
    request = await parked(db, model)
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice", note="ok")
    async with db.begin() as conn:
        await conn.execute(
            text(
                "UPDATE notes SET title = 'Board minutes: KEEP', updated_at = now() WHERE id = :n"
            ),
            {"n": note_id},
        )
    assert await make_worker(db, model, policy=asking(db)).run_once() == ["succeeded"]
    notes = {t.name: t for t in builtin_tools(db)}
    still = await notes["notes_read"].handler({"id": note_id}, ToolContext(user_id="u1"))
    assert still["title"] == "Board minutes: KEEP"
    sent = [m for r in model.requests for m in r.messages if m.role == "tool"]
    assert sent and "what it acts on changed since approved by alice" in str(sent[-1].content)
    assert "Board minutes: KEEP" in str(sent[-1].content)


async def test_an_approved_call_whose_target_is_unchanged_runs_once(db: AsyncEngine) -> None:
    note_id = await titled_note(db, "Q3 plan")
    model = calling("notes_delete", {"id": note_id})
    request = await parked(db, model)
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice", note="ok")
    assert await make_worker(db, model, policy=asking(db)).run_once() == ["succeeded"]
    notes = {t.name: t for t in builtin_tools(db)}
    listed = await notes["notes_list"].handler({}, ToolContext(user_id="u1"))
    assert note_id not in [n["id"] for n in listed["notes"]]


async def test_an_edit_that_keeps_title_length_and_second_is_still_a_changed_target(
    db: AsyncEngine,
) -> None:
    # found from outside: the read-back was display text only (title, size, time to the
    # second): a body rewritten at the same length within the same second passed for the
    # note the person saw. It now carries a version of the note's content.
    note_id = await titled_note(db, "Q3 plan", body="a" * 412)
    model = calling("notes_delete", {"id": note_id})
    request = await parked(db, model)
    assert "version " in request["target"]
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice", note="ok")
    async with db.begin() as conn:  # the same title and length; updated_at kept as it was
        await conn.execute(
            text("UPDATE notes SET body = :b WHERE id = :n"), {"b": "b" * 412, "n": note_id}
        )
    assert await make_worker(db, model, policy=asking(db)).run_once() == ["succeeded"]
    notes = {t.name: t for t in builtin_tools(db)}
    kept = await notes["notes_read"].handler({"id": note_id}, ToolContext(user_id="u1"))
    assert kept["body"] == "b" * 412


async def test_a_target_that_could_not_be_read_back_is_never_a_match(db: AsyncEngine) -> None:
    async def unreadable(args: dict[str, Any], ctx: ToolContext) -> str:
        raise ConnectionError("the bucket service is away")

    ran: list[dict[str, Any]] = []

    async def drop(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(args)
        return "dropped"

    tool = dataclasses.replace(bucket_tool(unreadable), handler=drop)
    model = calling("bucket_drop", {"bucket": "b1"})
    request = await parked(db, model, extra_tools=[tool])
    assert request["target"].startswith("(the tool could not say")
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice", note="ok")
    assert await make_worker(db, model, policy=asking(db), extra_tools=[tool]).run_once() == [
        "succeeded"
    ]
    assert ran == []  # unverified: not run
