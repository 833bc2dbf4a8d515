"""What a hostile or careless client of ``mana-ai serve`` gets, against real PostgreSQL: a
value the database would refuse, a number or a nesting past what Python reads, a key given
twice, other scripts' digits, a bug in a handler: each a clear 4xx naming the field, or a 500
that is logged whole and keeps the connection; the decider of an approval is the token,
never the body; hidden characters come back as escapes; 405 says what is allowed."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api_harness import BASE, api_client, token
from tests.integration.test_api import parked_over_the_api
from worker.errors import ConflictError
from worker.queries.admin_tokens import AdminTokenStore

AGENT = {"name": "a1", "owner": "u1", "tools": ["clock_now"]}


def error(response: Any) -> str:
    body = response.json()
    assert set(body) == {"error"} and body["error"]["status"] == response.status_code, body
    return str(body["error"]["message"])


async def post_raw(client: Any, path: str, raw: bytes) -> Any:
    return await client.post(path, content=raw, headers={"Content-Type": "application/json"})


async def test_bodies_python_or_postgresql_cannot_take_are_400_naming_why(
    db: AsyncEngine, database_url: str
) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        digits = await post_raw(
            client,
            "/api/v1/agents",
            b'{"name": "a", "owner": "u", "max_rounds": ' + b"9" * 5000 + b"}",
        )
        assert digits.status_code == 400 and "not JSON this server reads" in error(digits)
        nested = await post_raw(client, "/api/v1/agents", b"[" * 100_000 + b"]" * 100_000)
        assert nested.status_code in (400, 413)
        deep = await post_raw(
            client, "/api/v1/agents", b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        )
        assert deep.status_code == 400 and "nested too deeply" in error(deep)
        twice = await post_raw(
            client, "/api/v1/agents", b'{"name": "a", "name": "b", "owner": "u"}'
        )
        assert twice.status_code == 400 and "'name' is given twice" in error(twice)

        assert (await client.post("/api/v1/agents", json=AGENT)).status_code == 201
        late = await client.post(
            "/api/v1/missions",
            json={"agent": "a1", "objective": "x", "at": "9999-12-31T23:59:59-14:00"},
        )
        assert late.status_code == 400 and "at:" in error(late) and "out of range" in error(late)
        nul = await client.get("/api/v1/missions", params={"agent": "a\x00b"})
        assert nul.status_code == 400 and "agent" in error(nul)
        renamed = await client.patch("/api/v1/agents/a%00b", json={"max_rounds": 2})
        assert renamed.status_code == 400


@pytest.mark.parametrize("text", ["%201", "1_0", "%D9%A1", "%EF%BC%91", "+1", "%C2%B2"])
async def test_ids_are_ascii_digits_only(db: AsyncEngine, database_url: str, text: str) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        response = await client.get(f"/api/v1/missions/{text}")
        assert response.status_code == 400 and "id" in error(response)
        since = await client.get("/api/v1/policy/report", params={"since": "\u0661d"})
        assert since.status_code == 400


async def test_a_bug_is_a_logged_500_and_the_connection_goes_on(
    db: AsyncEngine,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from worker.queries.missions import AdminStore

    async def broken(self: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in listing agents")

    monkeypatch.setattr(AdminStore, "list_agents", broken)
    async with api_client(db, database_url, bearer=await token(db)) as client:
        with caplog.at_level(logging.ERROR, logger="worker.api.app"):
            response = await client.get("/api/v1/agents")
        assert response.status_code == 500 and "the server's log says why" in error(response)
        assert "a bug in listing agents" not in response.text  # no internals leak
        assert "GET /api/v1/agents failed" in caplog.text and "Traceback" in caplog.text
        assert (await client.get("/api/v1/missions")).status_code == 200


async def test_405_says_what_is_allowed(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        response = await client.delete("/api/v1/agents")
    assert response.status_code == 405 and "GET" in response.headers["allow"]


async def test_the_decider_is_the_token_and_live_token_names_are_unique(
    db: AsyncEngine, database_url: str
) -> None:
    tokens = AdminTokenStore(db)
    ops = await token(db, "ops")
    with pytest.raises(ConflictError, match="named 'ops' already"):
        await tokens.create_token("ops")
    async with api_client(db, database_url, bearer=ops) as client:
        pending = await parked_over_the_api(db, client)
        forged = await client.post(
            f"/api/v1/approvals/{pending['id']}/approve", json={"by": "alice", "note": "ok"}
        )
        assert forged.status_code == 400 and "by: unknown field" in error(forged)
        decided = await client.post(f"/api/v1/approvals/{pending['id']}/approve", json={})
        assert decided.json()["decided_by"] == "ops"
    [row] = await tokens.list_tokens()
    await tokens.revoke_token(row["id"])
    assert (await tokens.create_token("ops"))[0]["name"] == "ops"  # a revoked name is free


async def test_approvals_page_with_before_and_next(db: AsyncEngine, database_url: str) -> None:
    from tests.integration.test_cli_approvals import parked

    for _ in range(3):
        await parked(db)
    async with api_client(db, database_url, bearer=await token(db)) as client:
        first = (await client.get("/api/v1/approvals?limit=2")).json()
        assert len(first["approvals"]) == 2 and first["next"] is not None
        rest = (await client.get(f"/api/v1/approvals?limit=2&before={first['next']}")).json()
        assert len(rest["approvals"]) == 1 and rest["next"] is None
        ids = [a["id"] for a in first["approvals"] + rest["approvals"]]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == 3


async def test_hidden_characters_come_back_as_escapes(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        await client.post("/api/v1/agents", json=AGENT)
        objective = "pay \u202eevil\u202c now"  # stored text from a script, say
        from sqlalchemy import update

        from worker.db.tables import missions

        created = await client.post(
            "/api/v1/missions", json={"agent": "a1", "objective": "x", "due_now": True}
        )
        async with db.begin() as conn:
            await conn.execute(update(missions).values(objective=objective))
        response = await client.get(f"/api/v1/missions/{created.json()['id']}")
    assert "\u202e" not in response.text and "\\u202e" in response.text
    assert response.json()["objective"] == objective  # the same data, parsed


async def test_serve_metrics_are_its_own(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        await client.get("/api/v1/agents")
        await client.get("/api/v1/missions/1")
        text = (await client.get("/metrics")).text
    assert (
        'mana_ai_api_requests_total{method="GET",route="/api/v1/missions/{id}",status="404"}'
        in text
    )
    assert "mana_ai_api_request_duration_seconds_bucket" in text
    assert "mana_ai_missions_claimed" not in text  # the workers' figures are theirs


async def test_the_last_representable_time_is_refused_before_it_becomes_infinity(
    db: AsyncEngine, database_url: str
) -> None:
    async with api_client(db, database_url, bearer=await token(db)) as client:
        await client.post("/api/v1/agents", json=AGENT)
        for value in ("9999-12-31T23:59:59.999999+00:00", "9999-06-01T00:00:00+00:00"):
            response = await client.post(
                "/api/v1/missions",
                json={"agent": "a1", "objective": "x", "cron": "*/5 * * * *", "deadline": value},
            )
            assert response.status_code == 400 and "out of range" in error(response), value


async def test_names_that_read_the_same_are_one_token_name(db: AsyncEngine) -> None:
    tokens = AdminTokenStore(db)
    await tokens.create_token("Alice")
    for same in ("alice", "ALICE", "\uff41lice"):  # fullwidth a
        with pytest.raises(ConflictError):
            await tokens.create_token(same)
    await tokens.create_token("al\u00e9")  # é precomposed
    with pytest.raises(ConflictError):
        await tokens.create_token("ale\u0301")  # e and a combining acute


async def test_made_up_methods_and_vanished_clients_do_not_grow_or_alarm_the_metrics(
    db: AsyncEngine, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.integration.api_harness import app_for

    app = app_for(db, database_url)
    async with api_client(db, database_url) as client:
        for n in range(3):
            await client.request(f"Q{n}Z", "/x")
    sent: list[dict[str, Any]] = []

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/login",
        "raw_path": b"/login",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"origin", b"http://testserver"),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", b"100"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    with caplog.at_level(logging.ERROR, logger="worker.api.app"):
        await app(scope, gone, send)
    assert sent == [] and "failed" not in caplog.text  # nobody to answer; nothing wrong
    async with api_client(db, database_url) as client:
        text = (await client.get("/metrics")).text
    assert 'method="other"' in text and "Q0Z" not in text
    assert 'route="/login",status="499"' in text


async def test_the_public_address_may_name_its_default_port(
    db: AsyncEngine, database_url: str
) -> None:
    value = await token(db)
    async with api_client(db, database_url, console_url="https://mana.example.com:443") as client:
        signed = await client.post(
            "/login", data={"token": value}, headers={"Origin": "https://mana.example.com"}
        )
        assert signed.status_code == 303
        wrong = await client.delete("/login")
        assert wrong.status_code == 405 and set(wrong.headers["allow"].split(", ")) >= {
            "GET",
            "POST",
        }
        slash = await client.get("/approvals/", headers={"Host": "evil.example"})
        assert slash.status_code == 404  # no redirect built from the client's Host


async def test_going_back_never_leaves_for_another_site(db: AsyncEngine, database_url: str) -> None:
    from tests.integration.test_console import signed_in
    from tests.integration.worker_harness import add_mission

    mission_id = await add_mission(db, cron="0 9 * * *", objective="Tidy.")
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db))
        back = await client.post(
            f"/missions/{mission_id}/pause",
            data={"csrf": csrf},
            headers={"Origin": BASE, "Referer": f"{BASE}//evil.example/x"},
        )
    assert back.status_code == 303
    assert back.headers["location"] == f"/missions/{mission_id}?done=pause"
