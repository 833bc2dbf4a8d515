"""The JSON API of ``mana-ai serve`` against real PostgreSQL: tokens (none, revoked,
read-only), every resource with the CLI's rules and messages, malformed and oversized bodies,
paging, and the OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.testing import FunctionChatModel
from tests.integration.api_harness import api_client, token
from tests.integration.test_approvals import Model, a_note, asking
from tests.integration.worker_harness import clock_then_answer, make_worker
from worker.api.v1 import ENDPOINTS
from worker.db.tables import agents, missions
from worker.queries.admin_tokens import AdminTokenStore


async def count(db: AsyncEngine, table: Any) -> int:
    async with db.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


def error(response: Any) -> str:
    body = response.json()
    assert set(body) == {"error"} and body["error"]["status"] == response.status_code, body
    return str(body["error"]["message"])


AGENT = {"name": "a1", "owner": "u1", "tools": ["clock_now"]}


async def test_without_a_live_token_nothing_is_read_or_changed(
    db: AsyncEngine, database_url: str
) -> None:
    good = await token(db)
    async with api_client(db, database_url) as anonymous:
        response = await anonymous.post("/api/v1/agents", json=AGENT)
        assert response.status_code == 401 and "Bearer" in error(response)
        assert response.headers["www-authenticate"] == "Bearer"
        assert (await anonymous.get("/api/v1/missions")).status_code == 401
    async with api_client(db, database_url, bearer="mana_admin_made-up") as forged:
        response = await forged.post("/api/v1/agents", json=AGENT)
        assert response.status_code == 401 and "not valid" in error(response)
    [row] = await AdminTokenStore(db).list_tokens()
    await AdminTokenStore(db).revoke_token(row["id"])
    async with api_client(db, database_url, bearer=good) as revoked:
        assert (await revoked.post("/api/v1/agents", json=AGENT)).status_code == 401
        assert (await revoked.get("/api/v1/agents")).status_code == 401
    assert await count(db, agents) == 0


async def test_a_read_only_token_reads_and_changes_nothing(
    db: AsyncEngine, database_url: str
) -> None:
    writer, reader = await token(db), await token(db, "auditor", read_only=True)
    async with api_client(db, database_url, bearer=writer) as client:
        assert (await client.post("/api/v1/agents", json=AGENT)).status_code == 201
    async with api_client(db, database_url, bearer=reader) as client:
        assert [a["name"] for a in (await client.get("/api/v1/agents")).json()["agents"]] == ["a1"]
        response = await client.post(
            "/api/v1/missions", json={"agent": "a1", "objective": "x", "due_now": True}
        )
        assert response.status_code == 403 and "read-only" in error(response)
        patch = await client.patch("/api/v1/agents/a1", json={"max_rounds": 2})
        assert patch.status_code == 403
    assert await count(db, missions) == 0


async def test_agents_and_missions_follow_the_commands_rules(
    db: AsyncEngine, database_url: str
) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        created = await client.post("/api/v1/agents", json=AGENT | {"destructive": "ask"})
        assert created.status_code == 201 and created.json()["destructive_policy"] == "ask"
        taken = await client.post("/api/v1/agents", json=AGENT)
        assert taken.status_code == 409 and "already exists" in error(taken)
        cases = [
            ({"name": "a2", "owner": "u\n1"}, "owner must not contain control"),
            ({"name": "a2", "owner": "u", "max_rounds": 5000}, "max_rounds: expected at most 1000"),
            ({"name": "a2", "owner": "u", "max_rounds": "5"}, "max_rounds: Input should be"),
            ({"name": "a2", "owner": "u", "tools": ["nope"]}, "unknown tool(s) nope"),
            ({"name": "a2", "owner": "u", "policy_mode": "strict"}, "policy_mode must be one"),
            ({"name": "a2", "owner": "u", "compact_max_ctx": 10}, "expected 0 (never compact)"),
            ({"name": "a2", "owner": "u", "extra": 1}, "extra: unknown field"),
        ]
        for body, message in cases:
            response = await client.post("/api/v1/agents", json=body)
            assert response.status_code == 400 and message in error(response), (body, response.text)
        changed = await client.patch("/api/v1/agents/a1", json={"max_rounds": 3, "model": None})
        assert changed.status_code == 200 and changed.json()["max_rounds"] == 3
        missing = await client.patch("/api/v1/agents/nobody", json={"max_rounds": 3})
        assert missing.status_code == 404

        mission_cases = [
            ({"agent": "a1", "objective": "x"}, "give cron for a recurring mission"),
            ({"agent": "a1", "objective": "x", "cron": "0 9 * * monday"}, "day-of-week"),
            ({"agent": "a1", "objective": "x", "at": "2030-01-01T09:00"}, "at: '2030-01-01T09:00'"),
            ({"agent": "a1", "objective": "a\u202eb", "due_now": True}, "objective must not"),
            ({"agent": "nobody", "objective": "x", "due_now": True}, "no agent named"),
            (
                {"agent": "a1", "objective": "x", "due_now": True, "timezone": "Europe/Berlin"},
                "timezone is the time zone of cron",
            ),
            (
                {"agent": "a1", "objective": "x", "cron": "0 9 * * *", "catch_up": "sometimes"},
                "catch_up: Input should be 'skip', 'once' or 'all'",
            ),
            (
                {"agent": "a1", "objective": "x", "cron": "0 9 * * *", "catch_up_window": "6h"},
                "catch_up_window is how far back catch_up all runs missed runs",
            ),
            (
                {
                    "agent": "a1",
                    "objective": "x",
                    "cron": "0 9 * * *",
                    "catch_up": "all",
                    "catch_up_window": "40d",
                },
                "catch_up_window: expected a window from 1m to 30d",
            ),
        ]
        for body, message in mission_cases:
            response = await client.post("/api/v1/missions", json=body)
            assert response.status_code in (400, 404), (body, response.text)
            assert message in error(response), (body, response.text)
        assert await count(db, missions) == 0
        made = await client.post(
            "/api/v1/missions", json={"agent": "a1", "objective": "x", "cron": "0 9 * * *"}
        )
        assert made.status_code == 201 and made.json()["catch_up"] == "once"
        catching = await client.post(
            "/api/v1/missions",
            json={
                "agent": "a1",
                "objective": "y",
                "cron": "0 * * * *",
                "catch_up": "all",
                "catch_up_window": "6h",
            },
        )
        assert catching.status_code == 201, catching.text
        assert (catching.json()["catch_up"], catching.json()["catch_up_window"]) == ("all", "PT6H")
        mission_id = made.json()["id"]
        ran = await client.post(f"/api/v1/missions/{mission_id}/run")
        assert ran.status_code == 200 and ran.json()["changed"] is True
        paused = await client.post(f"/api/v1/missions/{mission_id}/pause")
        assert paused.json()["mission"]["status"] == "paused"
        refused = await client.post(f"/api/v1/missions/{mission_id}/run")
        assert refused.status_code == 409 and "resume it first" in error(refused)
        resumed = await client.post(f"/api/v1/missions/{mission_id}/resume")
        assert resumed.json()["mission"]["status"] == "active"
        assert (await client.get("/api/v1/missions/999")).status_code == 404
        assert (await client.get("/api/v1/missions/abc")).status_code == 400


async def test_malformed_and_oversized_bodies_are_refused_by_name(
    db: AsyncEngine, database_url: str
) -> None:
    async with api_client(
        db, database_url, bearer=await token(db), api_max_body_bytes=2048
    ) as client:
        bad = await client.post(
            "/api/v1/agents", content=b'{"name": ', headers={"Content-Type": "application/json"}
        )
        assert bad.status_code == 400 and "not JSON" in error(bad)
        listed = await client.post("/api/v1/agents", json=[1, 2])
        assert listed.status_code == 400 and "must be a JSON object" in error(listed)
        assert "not an array" in error(listed)
        null = await client.post("/api/v1/agents", content=b"null")
        assert null.status_code == 400 and "must be a JSON object, not null" in error(null)
        huge = await client.post("/api/v1/agents", json=AGENT | {"system_prompt": "x" * 5000})
        assert huge.status_code == 413 and "larger than 2048 bytes" in error(huge)

        async def chunks() -> Any:
            for _ in range(10):
                yield b"x" * 1000

        streamed = await client.post("/api/v1/agents", content=chunks())
        assert streamed.status_code == 413
    assert await count(db, agents) == 0


async def test_iterations_replay_rerun_and_paging(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        await client.post("/api/v1/agents", json=AGENT)
        for n in range(3):
            await client.post(
                "/api/v1/missions", json={"agent": "a1", "objective": f"m{n}", "due_now": True}
            )
        worker = make_worker(db, FunctionChatModel(clock_then_answer))
        assert await worker.run_once() == ["succeeded"] * 3
        first = (await client.get("/api/v1/missions?limit=2")).json()
        assert [m["objective"] for m in first["missions"]] == ["m2", "m1"]
        assert first["missions"][0]["last_status"] == "succeeded"
        rest = (await client.get(f"/api/v1/missions?limit=2&before={first['next']}")).json()
        assert [m["objective"] for m in rest["missions"]] == ["m0"] and rest["next"] is None
        its = (await client.get("/api/v1/iterations?limit=10")).json()["iterations"]
        assert len(its) == 3 and "messages" not in its[0]
        it = (await client.get(f"/api/v1/iterations/{its[0]['id']}")).json()
        assert [c["tool"] for c in it["tool_invocations"]] == ["clock_now"]
        replay = (await client.get(f"/api/v1/iterations/{its[0]['id']}/replay")).json()
        kinds = [e["event"] for e in replay["events"]]
        assert kinds.count("round") == 2 and "messages" not in replay["iteration"]
        rerun = await client.post(f"/api/v1/iterations/{its[0]['id']}/rerun", json={})
        assert rerun.status_code == 200 and rerun.json()["differences"] == []
        bad = await client.post(
            f"/api/v1/iterations/{its[0]['id']}/rerun", json={"policy_mode": "strict"}
        )
        assert bad.status_code == 400
        assert (await client.get("/api/v1/iterations?limit=0")).status_code == 400
        assert (await client.get("/api/v1/iterations?mission=999")).status_code == 404
        report = (await client.get("/api/v1/policy/report?since=1d")).json()
        assert report["calls"] == 3
        assert (await client.get("/api/v1/policy/report?since=forever")).status_code == 400


async def parked_over_the_api(db: AsyncEngine, client: Any) -> dict[str, Any]:
    """An agent and a mission made over the API, whose run a worker parks on a note's delete;
    the pending request."""
    note_id = await a_note(db)
    await client.post("/api/v1/agents", json={"name": "a1", "owner": "u1"})
    await client.post(
        "/api/v1/missions", json={"agent": "a1", "objective": "tidy", "due_now": True}
    )
    worker = make_worker(db, FunctionChatModel(Model(note_id)), policy=asking(db))
    assert await worker.run_once() == ["awaiting_approval"]
    [pending] = (await client.get("/api/v1/approvals?status=pending")).json()["approvals"]
    return dict(pending)


async def test_approvals_are_decided_once_over_the_api(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url, bearer=await token(db, "ops")) as client:
        pending = await parked_over_the_api(db, client)
        listed = (await client.get("/api/v1/missions")).json()["missions"]
        assert listed[0]["awaiting_approval"] == pending["id"]
        wrong = await client.post(
            f"/api/v1/approvals/{pending['id']}/approve", json={"reason": "no"}
        )
        assert wrong.status_code == 400
        approved = await client.post(
            f"/api/v1/approvals/{pending['id']}/approve", json={"note": "fine"}
        )
        assert approved.status_code == 200
        assert (approved.json()["decided_by"], approved.json()["status"]) == ("ops", "approved")
        again = await client.post(f"/api/v1/approvals/{pending['id']}/deny", json={})
        assert again.status_code == 409 and "was approved by ops" in error(again)
        assert (await client.post("/api/v1/approvals/999/approve", json={})).status_code == 404


async def test_mcp_tokens_are_listed_and_revoked(db: AsyncEngine, database_url: str) -> None:
    from worker.queries.mcp_tokens import McpStore

    row, _ = await McpStore(db).create_token("u1", label="laptop")
    async with api_client(db, database_url, bearer=await token(db)) as client:
        [listed] = (await client.get("/api/v1/mcp/tokens")).json()["tokens"]
        assert listed["label"] == "laptop" and "token_hash" not in listed
        revoked = (await client.post(f"/api/v1/mcp/tokens/{row['id']}/revoke")).json()
        assert revoked["changed"] is True and revoked["token"]["revoked_at"] is not None
        assert (await client.post("/api/v1/mcp/tokens/999/revoke")).status_code == 404


async def test_the_openapi_document_names_every_endpoint(
    db: AsyncEngine, database_url: str
) -> None:
    async with api_client(db, database_url) as client:
        response = await client.get("/api/v1/openapi.json")  # no token needed to read the docs
    document = response.json()
    assert response.status_code == 200 and document["openapi"].startswith("3.1")
    for endpoint in ENDPOINTS:
        operation = document["paths"][f"/api/v1{endpoint.path}"][endpoint.method.lower()]
        assert operation["summary"] == endpoint.summary
        if endpoint.body is not None:
            ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[1] in document["components"]["schemas"]
    ids = [op["operationId"] for path in document["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", ["/api/v1/agents", "/login", "/healthz", "/nope"])
async def test_every_answer_carries_the_security_headers(
    db: AsyncEngine, database_url: str, path: str
) -> None:
    async with api_client(db, database_url) as client:
        response = await client.get(path)
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
