"""The web console over HTTP (no browser: ``tests/e2e/test_console_browser.py`` has one):
signing in and out, the session cookie, CSRF and Origin on every form, read-only tokens, and
stored text that can never become markup."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.api_harness import BASE, api_client, token
from tests.integration.test_approvals import Model, a_note, asking
from tests.integration.worker_harness import add_mission, make_worker
from worker.db.tables import mission_iterations, tool_invocations
from worker.queries.admin_tokens import AdminTokenStore

SCRIPT = "<script>alert(1)</script>"
IMAGE = '<img src=x onerror="alert(2)">'


async def signed_in(client: httpx.AsyncClient, value: str) -> str:
    """Sign in with ``value``; the CSRF token of the session (from a page's form)."""
    response = await client.post(
        "/login", data={"token": value, "next": "/"}, headers={"Origin": BASE}
    )
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    page = await client.get("/")
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert match, page.text
    return match.group(1)


async def parked_request(db: AsyncEngine) -> int:
    note_id = await a_note(db)
    await add_mission(db, cron=None, objective="Tidy.")
    worker = make_worker(db, FunctionChatModel(Model(note_id)), policy=asking(db))
    assert await worker.run_once() == ["awaiting_approval"]
    return note_id


async def test_sign_in_sign_out_and_the_pages_behind_it(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url) as client:
        first = await client.get("/approvals")
        assert first.status_code == 303 and first.headers["location"] == "/login?next=/approvals"
        wrong = await client.post("/login", data={"token": "nope"}, headers={"Origin": BASE})
        assert wrong.status_code == 401 and "not valid" in wrong.text
        csrf = await signed_in(client, await token(db))
        for path in ("/", "/approvals", "/policy"):
            page = await client.get(path)
            assert page.status_code == 200 and page.headers["cache-control"] == "no-store", path
        out = await client.post("/logout", data={"csrf": csrf}, headers={"Origin": BASE})
        assert out.status_code == 303
        assert (await client.get("/")).status_code == 303  # the session ended


async def test_a_revoked_token_ends_its_sessions(db: AsyncEngine, database_url: str) -> None:
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))
        [row] = await AdminTokenStore(db).list_tokens()
        await AdminTokenStore(db).revoke_token(row["id"])
        assert (await client.get("/")).status_code == 303


async def test_forms_need_their_csrf_token_and_this_origin(
    db: AsyncEngine, database_url: str
) -> None:
    await parked_request(db)
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db))
        for data, headers in (
            ({}, {"Origin": BASE}),  # no token
            ({"csrf": "0" * 64}, {"Origin": BASE}),  # another session's
            ({"csrf": csrf}, {"Origin": "https://evil.example"}),  # another site
            ({"csrf": csrf}, {}),  # no Origin, no Referer
        ):
            response = await client.post("/approvals/1/approve", data=data, headers=headers)
            assert response.status_code == 403, (data, headers)
        login_elsewhere = await client.post(
            "/login", data={"token": "x"}, headers={"Origin": "https://evil.example"}
        )
        assert login_elsewhere.status_code == 403
        ok = await client.post(
            "/approvals/1/approve", data={"csrf": csrf, "note": "ok"}, headers={"Origin": BASE}
        )
        assert ok.status_code == 303
    async with api_client(db, database_url) as client:
        listed = await client.get("/api/v1/approvals")
        assert listed.status_code == 401  # the API never takes the cookie


async def test_a_read_only_session_sees_no_buttons_and_cannot_decide(
    db: AsyncEngine, database_url: str
) -> None:
    await parked_request(db)
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db, "auditor", read_only=True))
        page = await client.get("/approvals")
        assert "auditor (read-only)" in page.text and "Approve</button>" not in page.text
        refused = await client.post(
            "/approvals/1/approve", data={"csrf": csrf}, headers={"Origin": BASE}
        )
        assert refused.status_code == 403 and "read-only" in refused.text


async def test_a_decision_answers_its_row_says_who_decided_first_and_why_it_failed(
    db: AsyncEngine, database_url: str
) -> None:
    await parked_request(db)
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db, "ops"))
        headers = {"Origin": BASE, "HX-Request": "true"}
        row = await client.post(
            "/approvals/1/deny", data={"csrf": csrf, "note": "no"}, headers=headers
        )
        assert row.status_code == 200 and row.text.lstrip().startswith('<article class="approval')
        assert "denied by ops" in row.text
        late = await client.post("/approvals/1/approve", data={"csrf": csrf}, headers=headers)
        assert "was denied by ops" in late.text and 'role="alert"' in late.text
        # without JavaScript: the inbox again, saying why at the row
        plain = await client.post(
            "/approvals/1/approve", data={"csrf": csrf}, headers={"Origin": BASE}
        )
        assert plain.status_code == 409 and "was denied by ops" in plain.text
        # a button whose request fails (a session ended elsewhere): said at the top
        ended = await client.post("/approvals/1/approve", data={"csrf": "0" * 64}, headers=headers)
        assert ended.status_code == 403 and ended.headers["hx-retarget"] == "#flash"
        assert ended.text.startswith('<p class="error" role="alert">403:')
        page = await client.get("/approvals")
        assert '"responseHandling"' in page.text  # htmx swaps 4xx/5xx answers too


async def test_stored_text_never_becomes_markup(db: AsyncEngine, database_url: str) -> None:
    mission_id = await add_mission(db, cron=None, objective=f"Note {SCRIPT} and {IMAGE}")

    def model(request: Any) -> Any:
        if any(m.role == "tool" for m in request.messages):
            return final_answer(f"Done {SCRIPT}")
        return tool_calls(("clock_now", {}), text=IMAGE)

    worker = make_worker(db, FunctionChatModel(model))
    assert await worker.run_once() == ["succeeded"]
    async with db.begin() as conn:  # a tool result and an MCP tool name a peer made up
        [messages] = (await conn.execute(select(mission_iterations.c.messages))).scalars()
        for message in messages:
            for call in message.get("tool_calls") or []:
                call["name"] = f"evil__{SCRIPT}"
            if message["role"] == "tool":
                message["content"] = json.dumps({"text": IMAGE, SCRIPT: "\u202eevil"})
        await conn.execute(update(mission_iterations).values(messages=messages))
        await conn.execute(update(tool_invocations).values(tool=f"evil__{SCRIPT}"))
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))
        pages = [
            await client.get("/"),
            await client.get(f"/missions/{mission_id}"),
            await client.get("/iterations/1"),
        ]
    for page in pages:
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "<img" not in page.text  # text, not tags
        assert "\u202e" not in page.text  # shown as an escape, not obeyed
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0].text
    assert "evil__&lt;script&gt;" in pages[2].text and "\\u202e" in pages[2].text


async def test_a_request_whose_arguments_were_edited_is_flagged_and_cannot_be_approved(
    db: AsyncEngine, database_url: str
) -> None:
    from worker.db.tables import approval_requests

    await parked_request(db)
    async with db.begin() as conn:  # someone with database access changes the reviewed call
        await conn.execute(update(approval_requests).values(arguments={"id": 1, "all": True}))
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db, "ops"))
        page = await client.get("/approvals")
        assert "not the ones the model asked for" in page.text
        headers = {"Origin": BASE, "HX-Request": "true"}
        row = await client.post("/approvals/1/approve", data={"csrf": csrf}, headers=headers)
        assert 'role="alert"' in row.text and "approved by" not in row.text
        api = await client.get(
            "/api/v1/approvals/1",
            headers={"Authorization": f"Bearer {await token(db, 'reader', read_only=True)}"},
        )
        assert api.json()["arguments_intact"] is False


async def test_behind_a_proxy_the_console_url_is_this_origin(
    db: AsyncEngine, database_url: str
) -> None:
    public = "https://mana.example.com"
    value = await token(db)
    async with api_client(db, database_url, console_url=public) as client:
        # the proxy passed neither the host nor the scheme on: the app sees testserver, http
        signed = await client.post("/login", data={"token": value}, headers={"Origin": public})
        assert signed.status_code == 303
        assert "Secure" in signed.headers["set-cookie"]  # the public address is https
        elsewhere = await client.post(
            "/login", data={"token": value}, headers={"Origin": "https://mana.example.org"}
        )
        assert elsewhere.status_code == 403 and "MANA_AI_CONSOLE_URL" in elsewhere.text


async def test_mission_buttons_say_what_they_did(db: AsyncEngine, database_url: str) -> None:
    mission_id = await add_mission(db, cron="0 9 * * *", objective="Tidy.")
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db))
        headers = {"Origin": BASE, "Referer": f"{BASE}/missions/{mission_id}"}
        for action, said in (
            ("pause", "Paused: no run starts"),
            ("pause", "Nothing changed"),
            ("resume", "Resumed."),
            ("run", "Made due now"),
        ):
            done = await client.post(
                f"/missions/{mission_id}/{action}", data={"csrf": csrf}, headers=headers
            )
            assert done.status_code == 303, action
            page = await client.get(done.headers["location"])
            assert said in page.text, action
        made_up = await client.get(f"/missions/{mission_id}?done=<b>phish</b>")
        assert "phish" not in made_up.text  # only the console's own texts


@pytest.mark.parametrize("path", ["/missions/%C2%B2", "/missions/%D9%A1", "/iterations/+1"])
async def test_ids_of_other_scripts_are_no_page(
    db: AsyncEngine, database_url: str, path: str
) -> None:
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))
        assert (await client.get(path)).status_code == 404
        since = await client.get("/policy?since=garbage")
        assert since.status_code == 400 and "since" in since.text


async def test_a_sign_in_deletes_sessions_ended_a_day_ago(
    db: AsyncEngine, database_url: str
) -> None:
    from datetime import timedelta

    from sqlalchemy import func

    from worker.db.tables import admin_sessions

    value = await token(db)
    async with api_client(db, database_url) as client:
        await signed_in(client, value)
    async with db.begin() as conn:
        await conn.execute(update(admin_sessions).values(expires_at=func.now() - timedelta(days=2)))
    async with api_client(db, database_url) as client:
        await signed_in(client, value)
    async with db.connect() as conn:
        left = (await conn.execute(select(func.count()).select_from(admin_sessions))).scalar_one()
    assert left == 1
