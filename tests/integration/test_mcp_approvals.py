"""Approvals for MCP clients of ``mcp serve`` (real streamable HTTP, the SDK's client, real
PostgreSQL): in ``ask`` a destructive call is refused with a tool error naming its approval
request, calling again does not ask again, and once approved the same call (same user, tool
and arguments) runs once."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.test_mcp_serve import connect, note_count, serving, text_of, token_for
from worker.db.tables import tool_invocations
from worker.queries.approval_requests import ApprovalStore


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


async def test_an_mcp_denial_is_told_to_the_client_and_an_approval_lapses_unused(
    db: AsyncEngine, database_url: str
) -> None:
    from sqlalchemy import func, text, update

    from worker.db.tables import approval_requests

    _, token = await token_for(db, "alice")
    store = ApprovalStore(db)
    async with (
        serving(database_url, policy_mode="enforce", policy_destructive="ask") as server,
        connect(server, token) as client,
    ):
        one = (await client.call_tool("notes_create", {"title": "a"})).structured_content["id"]
        two = (await client.call_tool("notes_create", {"title": "b"})).structured_content["id"]
        await client.call_tool("notes_delete", {"id": one})
        [asked] = await store.list_requests()
        await store.decide(asked["id"], approve=False, by="carol", note="no way")
        denied = await client.call_tool("notes_delete", {"id": one})
        assert denied.is_error and "denied by carol" in text_of(denied)
        assert "no way" in text_of(denied)
        assert len(await store.list_requests()) == 1  # told, not asked again

        await client.call_tool("notes_delete", {"id": two})
        second = next(r for r in await store.list_requests() if r["id"] != asked["id"])
        await store.decide(second["id"], approve=True, by="bob")
        async with db.begin() as conn:  # its time to live ends before the client comes back
            await conn.execute(
                update(approval_requests)
                .where(approval_requests.c.id == second["id"])
                .values(expires_at=func.now() - text("interval '1 second'"))
            )
        lapsed = await client.call_tool("notes_delete", {"id": two})
        assert lapsed.is_error and "approval request" in text_of(lapsed)  # asked anew
    assert await note_count(db, "alice") == 2


async def test_an_mcp_approval_is_for_the_note_the_person_saw(
    db: AsyncEngine, database_url: str
) -> None:
    # found from outside: over MCP the approved delete ran after the note was rewritten
    # between the approval and the call (the MCP path did not carry the card's read-back)
    _, token = await token_for(db, "alice")
    store = ApprovalStore(db)
    async with (
        serving(database_url, policy_mode="enforce", policy_destructive="ask") as server,
        connect(server, token) as client,
    ):
        note_id = (await client.call_tool("notes_create", {"title": "Q3 plan"})).structured_content[
            "id"
        ]
        await client.call_tool("notes_delete", {"id": note_id})
        [request] = await store.list_requests()
        assert "Q3 plan" in request["target"]
        await store.decide(request["id"], approve=True, by="bob")
        await client.call_tool(
            "notes_update", {"id": note_id, "title": "Board minutes: KEEP", "body": "kept"}
        )
        refused = await client.call_tool("notes_delete", {"id": note_id})
        assert refused.is_error and "what it acts on changed" in text_of(refused)
        assert await note_count(db, "alice") == 1
