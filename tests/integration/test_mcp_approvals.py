"""Approvals for MCP clients of ``mcp serve`` (real streamable HTTP, the SDK's client, real
PostgreSQL): in ``ask`` a destructive call is refused with a tool error naming its approval
request, calling again does not ask again, and once approved the same call (same user, tool
and arguments) runs once."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.test_mcp_serve import connect, note_count, serving, text_of, token_for
from worker.store.approvals import ApprovalStore
from worker.store.tables import tool_invocations


async def test_an_mcp_call_waits_for_its_approval_and_then_runs_once(
    db: AsyncEngine, database_url: str
) -> None:
    token_id, token = await token_for(db, "alice")
    store = ApprovalStore(db)
    async with (
        serving(database_url, policy_mode="enforce", policy_destructive="ask") as server,
        connect(server, token) as client,
    ):
        created = await client.call_tool("notes_create", {"title": "old"})
        note_id = created.structured_content["id"]
        other = (await client.call_tool("notes_create", {"title": "other"})).structured_content

        refused = await client.call_tool("notes_delete", {"id": note_id})
        [request] = await store.list_requests()
        assert refused.is_error and f"approval request {request['id']}" in text_of(refused)
        assert (request["consumer"], request["user_id"], request["mcp_token_id"]) == (
            "mcp",
            "alice",
            token_id,
        )
        again = await client.call_tool("notes_delete", {"id": note_id})
        assert again.is_error and f"approval request {request['id']}" in text_of(again)
        assert len(await store.list_requests()) == 1  # the same call is not asked twice

        await store.decide(request["id"], approve=True, by="bob")
        # another call (other arguments) is not what was approved: it is asked about
        elsewhere = await client.call_tool("notes_delete", {"id": other["id"]})
        assert elsewhere.is_error and "approval request" in text_of(elsewhere)

        ran = await client.call_tool("notes_delete", {"id": note_id})
        assert not ran.is_error, text_of(ran)
        assert await note_count(db, "alice") == 1
        assert (await store.get(request["id"]))["used_at"] is not None

        # used up: the same call again is a new question
        once_more = await client.call_tool("notes_delete", {"id": note_id})
        assert once_more.is_error and "approval request" in text_of(once_more)
    async with db.connect() as conn:
        reasons = (
            (
                await conn.execute(
                    select(tool_invocations.c.policy_decision["reason"].astext)
                    .where(tool_invocations.c.tool == "notes_delete")
                    .order_by(tool_invocations.c.id)
                )
            )
            .scalars()
            .all()
        )
    assert reasons == [
        "approval_required",
        "approval_required",
        "approval_required",
        "approved",
        "approval_required",
    ]
