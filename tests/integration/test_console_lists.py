"""What the console, the API and the commands show in their lists and long pages (issue 31,
items 10, 11 and 14): a long iteration's page is paged and drawn off the event loop (``/healthz``
answers while pages render), the verdict's warning (an answer stating figures no tool
returned) is in every list, times are in one format with the schedule's local time beside
them, iterations show their start, end, duration, worker and attempt, and a page with
something running follows it."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import jinja2
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse
from planner.approvals import arguments_hash
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.api_harness import api_client, token
from tests.integration.test_cli_approvals import cli
from tests.integration.test_console import signed_in
from tests.integration.worker_harness import make_worker, policy_setup
from worker.api import v1
from worker.api.console import MISSIONS_PER_PAGE
from worker.api.timeline import ROUNDS_PER_PAGE
from worker.db.tables import mission_iterations
from worker.queries.approval_requests import ApprovalStore
from worker.queries.missions import AdminStore
from worker.store.records import ApprovalRequestRow

LATER = datetime(2999, 1, 1, tzinfo=UTC)
"""A next run no worker of a test gets to."""

MADE_UP = "23:45:17"
"""A time the model states without any tool having returned it."""


async def agent_and_mission(
    db: AsyncEngine,
    *,
    name: str = "teller",
    max_rounds: int = 5,
    cron: str | None = None,
    timezone: str = "UTC",
) -> int:
    admin = AdminStore(db)
    agent = await admin.add_agent(
        name=name, owner_user_id="u1", system_prompt="Answer.", max_rounds=max_rounds
    )
    mission = await admin.add_mission(
        agent_id=agent["id"],
        objective="What time is it?",
        cron=cron,
        timezone=timezone,
        next_run_at="now",
    )
    return int(mission["id"])


async def run_once(db: AsyncEngine, answer: Any, outcome: str = "succeeded") -> int:
    worker = make_worker(db, FunctionChatModel(answer), policy=policy_setup(db, "off"))
    assert await worker.run_once() == [outcome]
    [latest] = await AdminStore(db).list_iterations(limit=1)
    return int(latest["id"])


def made_up(request: CompletionRequest) -> CompletionResponse:
    return final_answer(f"It is {MADE_UP}.")


def from_the_clock(request: CompletionRequest) -> CompletionResponse:
    results = [m.content for m in request.messages if m.role == "tool"]
    if results:
        return final_answer(f"The clock said: {results[-1]}")
    return tool_calls(("clock_now", {}))


def rounds_of_reads(rounds: int) -> FunctionChatModel:
    """A model that reads the clock ``rounds`` times, one round each, then answers."""

    def answer(request: CompletionRequest) -> CompletionResponse:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done >= rounds:
            return final_answer("Done reading the clock.")
        return tool_calls(("clock_now", {}), text="Reading the clock once more. " * 8)

    return FunctionChatModel(answer)


# -- item 10: long pages ----------------------------------------------------------------------


async def long_iteration(db: AsyncEngine, rounds: int = 200) -> int:
    await agent_and_mission(db, name="long", max_rounds=rounds + 1)
    worker = make_worker(db, rounds_of_reads(rounds), policy=policy_setup(db, "off"))
    assert await worker.run_once() == ["succeeded"]
    [latest] = await AdminStore(db).list_iterations(limit=1)
    assert latest["rounds"] == rounds + 1
    return int(latest["id"])


async def test_a_200_round_iteration_is_paged(db: AsyncEngine, database_url: str) -> None:
    iteration_id = await long_iteration(db)
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))
        first = await client.get(f"/iterations/{iteration_id}")
        assert first.status_code == 200
        assert first.text.count('<section class="round"') == ROUNDS_PER_PAGE
        assert f'rel="next" href="/iterations/{iteration_id}?page=2"' in first.text
        assert len(first.content) < 256 * 1024, len(first.content)  # 2.1 MiB unpaged
        pages = -(-(200 + 1) // ROUNDS_PER_PAGE)
        last = await client.get(f"/iterations/{iteration_id}?page={pages}")
        assert last.status_code == 200 and 'rel="next"' not in last.text
        assert f'id="round-{200 + 1}"' in last.text and 'id="round-1"' not in last.text
        assert "Done reading the clock." in last.text  # the answer is on the last page
        beyond = await client.get(f"/iterations/{iteration_id}?page={pages + 1}")
        assert beyond.status_code == 404
        for page in range(1, pages + 1):  # every round is on exactly one page
            text = (await client.get(f"/iterations/{iteration_id}?page={page}")).text
            shown = [int(n) for n in re.findall(r'<section class="round" id="round-(\d+)"', text)]
            last_shown = min(page * ROUNDS_PER_PAGE, 200 + 1)
            assert shown == list(range((page - 1) * ROUNDS_PER_PAGE + 1, last_shown + 1))


async def test_the_pager_says_which_rounds_each_page_holds(
    db: AsyncEngine, database_url: str
) -> None:
    """A 231-round iteration: each page names its own rounds (never 1-231 on page 1), and the
    links name the rounds of the page they open, the last page's end included."""
    assert ROUNDS_PER_PAGE == 20
    iteration_id = await long_iteration(db, rounds=230)
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))

        async def pager(page: int) -> str:
            text = (await client.get(f"/iterations/{iteration_id}?page={page}")).text
            nav = text.split('<nav class="pager"')[1].split("</nav>")[0]
            return visible_text(nav).replace("\N{EN DASH}", "-")  # as the page writes it

        first = await pager(1)
        assert "rounds 1-20 of 231 (page 1 of 12)" in first and "←" not in first
        assert "rounds 21-40 →" in first
        second = await pager(2)
        assert "← rounds 1-20" in second and "rounds 21-40 of 231" in second
        assert "rounds 41-60 →" in second
        eleventh = await pager(11)
        assert "rounds 201-220 of 231" in eleventh and "rounds 221-231 →" in eleventh
        last = await pager(12)
        assert "← rounds 201-220" in last and "rounds 221-231 of 231 (page 12 of 12)" in last
        assert "→" not in last


async def test_pages_render_off_the_event_loop_while_healthz_answers(
    db: AsyncEngine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four pages (and an API answer) whose drawing is held until /healthz has answered: were
    any drawn on the event loop, /healthz could not answer and the test would time out."""
    iteration_id = await long_iteration(db, rounds=30)
    release = threading.Event()
    drawing = threading.Semaphore(0)
    threads: list[bool] = []
    real_render, real_json = jinja2.Template.render, v1._json

    def held(on_main: bool) -> None:
        threads.append(on_main)
        drawing.release()
        assert release.wait(20), "held for too long"

    def render(self: jinja2.Template, *args: Any, **kwargs: Any) -> str:
        if self.name == "iteration.html":
            held(threading.current_thread() is threading.main_thread())
        return real_render(self, *args, **kwargs)

    def json_answer(data: Any, status: int = 200) -> Any:
        held(threading.current_thread() is threading.main_thread())
        return real_json(data, status)

    monkeypatch.setattr(jinja2.Template, "render", render)
    monkeypatch.setattr(v1, "_json", json_answer)
    async with api_client(db, database_url, bearer=await token(db, "api")) as client:
        await signed_in(client, await token(db))
        pages = [
            asyncio.create_task(client.get(f"/iterations/{iteration_id}?page={n}"))
            for n in (1, 2, 1, 2)
        ]
        pages.append(asyncio.create_task(client.get(f"/api/v1/iterations/{iteration_id}")))
        for _ in range(len(pages)):  # all five are being drawn, none is finished
            assert await asyncio.to_thread(drawing.acquire, True, 20)
        health = await asyncio.wait_for(client.get("/healthz"), 10)
        assert health.status_code == 200 and not any(p.done() for p in pages)
        release.set()
        answers = await asyncio.gather(*pages)
    assert [a.status_code for a in answers] == [200] * 5
    assert threads == [False] * 5  # each drawn in a worker thread


# -- item 11: the verdict's warning in every list ------------------------------------------------


async def test_a_made_up_answer_is_flagged_in_every_list(
    db: AsyncEngine, database_url: str, run: Any
) -> None:
    mission_id = await agent_and_mission(db)
    made_up_id = await run_once(db, made_up)
    honest_mission = await agent_and_mission(db, name="honest")
    honest_id = await run_once(db, from_the_clock)
    async with api_client(db, database_url, bearer=await token(db, "api")) as client:
        listed = (await client.get("/api/v1/iterations")).json()["iterations"]
        warnings = {row["id"]: row["warning"] for row in listed}
        assert MADE_UP in warnings[made_up_id] and "no tool returned" in warnings[made_up_id]
        assert warnings[honest_id] is None
        missions = (await client.get("/api/v1/missions")).json()["missions"]
        last = {row["id"]: row["last_warning"] for row in missions}
        assert MADE_UP in last[mission_id] and last[honest_mission] is None
        shown = (await client.get(f"/api/v1/iterations/{made_up_id}")).json()
        assert MADE_UP in shown["warning"] and shown["verdict"].startswith("verdict: succeeded")
        await signed_in(client, await token(db))
        for path in ("/", f"/missions/{mission_id}"):
            page = (await client.get(path)).text
            assert f"the answer states {MADE_UP}, which no tool returned" in page, path
        assert "no tool returned" not in (await client.get(f"/missions/{honest_mission}")).text

    code, out, _ = await cli(run, "iterations", "list")
    assert code == 0 and "WARNING" in out and MADE_UP in out
    code, out, _ = await cli(run, "iterations", "list", "--json")
    rows = {row["id"]: row for row in json.loads(out)}
    assert MADE_UP in rows[made_up_id]["warning"] and rows[honest_id]["warning"] is None
    code, out, _ = await cli(run, "missions", "history", str(mission_id))
    assert code == 0 and f"warning: the answer states {MADE_UP}" in out
    code, out, _ = await cli(run, "missions", "history", str(mission_id), "--json")
    assert MADE_UP in json.loads(out)["iterations"][0]["warning"]


# -- item 14: times ---------------------------------------------------------------------------

ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
CONSOLE_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (UTC|[A-Z]{3,5}|[+-]\d\d)")


def visible_text(html: str) -> str:
    """The page's text, without tags and their attributes (``datetime="…"`` is for machines)."""
    return re.sub(r"<[^>]*>", " ", html)


async def test_times_are_in_one_format_with_the_schedules_local_time(
    db: AsyncEngine, database_url: str, run: Any
) -> None:
    mission_id = await agent_and_mission(db, cron="0 9 * * *", timezone="Europe/Berlin")
    admin = AdminStore(db)
    await admin.run_now(mission_id)
    iteration_id = await run_once(db, lambda request: final_answer("Done."))  # no tool's times
    async with api_client(db, database_url, bearer=await token(db, "api")) as client:
        mission = (await client.get(f"/api/v1/missions/{mission_id}")).json()
        assert mission["next_run_local"].endswith(("+01:00", "+02:00"))
        assert mission["next_run_local"][11:16] == "09:00"  # the cron's own hour, there
        [listed] = (await client.get("/api/v1/missions")).json()["missions"]
        assert listed["next_run_local"] == mission["next_run_local"]
        await signed_in(client, await token(db))
        page = (await client.get(f"/missions/{mission_id}")).text
        assert re.search(r"\d{4}-\d\d-\d\d 09:00:00 CES?T, Europe/Berlin", page), page
        for path in ("/", f"/missions/{mission_id}", f"/iterations/{iteration_id}", "/approvals"):
            text = visible_text((await client.get(path)).text)
            assert not ISO_TIME.search(text), (path, ISO_TIME.search(text))
        text = visible_text((await client.get(f"/iterations/{iteration_id}")).text)
        for fact in ("Started", "Finished", "Duration", "Worker"):
            assert fact in text
        assert "w1; attempt 1" in text
        assert len(CONSOLE_TIME.findall(text)) >= 3  # scheduled, started, finished
        listed_page = visible_text((await client.get(f"/missions/{mission_id}")).text)
        assert " ms" in listed_page or " s" in listed_page  # a duration in the list
    code, out, _ = await cli(run, "missions", "show", str(mission_id), "--json")
    assert code == 0 and json.loads(out)["next_run_local"] == mission["next_run_local"]
    code, out, _ = await cli(run, "missions", "list", "--json")
    assert code == 0 and json.loads(out)[0]["next_run_local"] == mission["next_run_local"]


async def test_after_run_now_the_mission_page_follows_the_run(
    db: AsyncEngine, database_url: str
) -> None:
    mission_id = await agent_and_mission(db, cron="0 9 * * *")
    await run_once(db, from_the_clock)
    async with api_client(db, database_url) as client:
        csrf = await signed_in(client, await token(db))
        still = (await client.get(f"/missions/{mission_id}")).text
        assert 'hx-trigger="every' not in still and 'http-equiv="refresh"' not in still
        ran = await client.post(
            f"/missions/{mission_id}/run",
            data={"csrf": csrf},
            headers={
                "Origin": "http://testserver",
                "Referer": f"http://testserver/missions/{mission_id}",
            },
        )
        assert ran.status_code == 303
        due = (await client.get(ran.headers["location"])).text
        assert f'hx-get="/missions/{mission_id}" hx-trigger="every 3s"' in due
        assert f'http-equiv="refresh" content="5; url=/missions/{mission_id}"' in due
        assert "done=" not in due.split('id="live"')[1].split(">")[0]
        iteration_id = await run_once(db, from_the_clock)
        done = (await client.get(f"/missions/{mission_id}")).text
        assert 'hx-trigger="every' not in done
        async with db.begin() as conn:  # as a worker has it while the run goes on
            await conn.execute(
                update(mission_iterations)
                .where(mission_iterations.c.id == iteration_id)
                .values(status="running", finished_at=None)
            )
        running = (await client.get(f"/iterations/{iteration_id}")).text
        assert f'hx-get="/iterations/{iteration_id}" hx-trigger="every 3s"' in running
        assert "Finished</dt><dd>running" in running


# -- past the end of a list ---------------------------------------------------------------------


async def test_past_the_end_of_a_list_it_says_so_and_links_back_to_the_newest(
    db: AsyncEngine, database_url: str
) -> None:
    """``?before=`` past the last row: "no older missions/runs" and a way back, never "No
    missions yet" or "No run yet" while there are some; every page after the first links to
    the newest."""
    admin = AdminStore(db)
    agent = await admin.add_agent(name="many", owner_user_id="u1", system_prompt="Answer.")
    ids = [
        (await admin.add_mission(agent_id=agent["id"], objective=f"Task {n}.", cron=None,
                                 timezone="UTC", next_run_at="now" if n == 0 else LATER))["id"]
        for n in range(MISSIONS_PER_PAGE + 1)
    ]  # fmt: skip
    iteration_id = await run_once(db, lambda request: final_answer("Done."))
    mission_id = (await admin.get_iteration(iteration_id))["mission_id"]
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))
        first = (await client.get("/")).text
        assert "← newest" not in first and f'href="/?before={ids[1]}"' in first
        second = (await client.get(f"/?before={ids[1]}")).text
        assert '<a rel="first" href="/">← newest</a>' in second and "Task 0." in second
        beyond = (await client.get(f"/?before={min(ids)}")).text
        assert "No missions yet" not in beyond and "No older missions" in beyond
        assert '<a rel="first" href="/">← newest</a>' in beyond
        runs = (await client.get(f"/missions/{mission_id}")).text
        assert f'href="/iterations/{iteration_id}"' in runs and "← newest" not in runs
        older = (await client.get(f"/missions/{mission_id}?before={iteration_id + 1}")).text
        assert f'href="/iterations/{iteration_id}"' in older
        assert f'<a rel="first" href="/missions/{mission_id}">← newest</a>' in older
        none = (await client.get(f"/missions/{mission_id}?before={iteration_id}")).text
        assert "No run yet" not in none and "No older runs" in none
        assert f'<a rel="first" href="/missions/{mission_id}">← newest</a>' in none


async def mcp_requests(db: AsyncEngine, count: int, tool: str) -> list[int]:
    """``count`` pending requests of an MCP client's calls of ``tool``; their ids."""
    store, ids = ApprovalStore(db), []
    for n in range(count):
        arguments = {"id": n}
        row, _ = await store.request_mcp(
            ApprovalRequestRow(
                consumer="mcp", user_id="u1", call_id=f"call-{tool}-{n}", tool=tool,
                arguments=arguments, arguments_hash=arguments_hash(arguments),
                reason="destructive", ttl=timedelta(hours=1),
            )
        )  # fmt: skip
        ids.append(int(row["id"]))
    return ids


async def test_the_approvals_inbox_pages_what_waits_and_what_was_decided(
    db: AsyncEngine, database_url: str
) -> None:
    """105 requests wait, 3 older ones were decided: the inbox shows 50 of each part a page,
    says when more exist and links to them (``?status=…&before=ID``), and the decided ones
    are there (they were lost behind the newest 100 requests of any status)."""
    decided = await mcp_requests(db, 3, "notes_delete")
    for request_id in decided:
        await ApprovalStore(db).decide(request_id, approve=False, by="ops", note="no")
    waiting = await mcp_requests(db, 105, "files_delete")
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))

        def shown(text: str) -> list[int]:
            return [
                int(n)
                for n in re.findall(r'<article class="approval[^"]*" id="approval-(\d+)"', text)
            ]

        first = (await client.get("/approvals")).text
        assert shown(first) == waiting[::-1][:50] + decided[::-1]
        assert "No decision yet" not in first and "← newest" not in first
        more = f'href="/approvals?status=pending&amp;before={waiting[-50]}#pending"'
        assert "More pending requests than this page shows" in first and more in first
        assert "status=decided&amp;before" not in first  # all three decided ones are shown
        second = (await client.get(f"/approvals?status=pending&before={waiting[-50]}")).text
        assert shown(second) == waiting[::-1][50:100] and '<h2 id="decided"' not in second
        assert '<a rel="first" href="/approvals">← newest</a>' in second
        third = (await client.get(f"/approvals?status=pending&before={waiting[-100]}")).text
        assert shown(third) == waiting[::-1][100:] and "More pending" not in third
        older = (await client.get(f"/approvals?status=decided&before={decided[0]}")).text
        assert shown(older) == [] and "No older decided requests" in older
        for bad in ("before=abc", "status=bogus", "before=0", "status=pending&before=-1"):
            assert (await client.get(f"/approvals?{bad}")).status_code == 404, bad


async def test_a_page_that_is_not_one_says_what_is_expected(
    db: AsyncEngine, database_url: str
) -> None:
    """The console answers 404 for a page number or an id it cannot take (the API, 400), and
    says what it takes: pages run from 1 (never "'0' is not an id")."""
    await agent_and_mission(db)
    iteration_id = await run_once(db, lambda request: final_answer("Done."))
    async with api_client(db, database_url) as client:
        await signed_in(client, await token(db))
        for query in ("page=0", "page=abc", "page=-1"):
            answer = await client.get(f"/iterations/{iteration_id}?{query}")
            assert answer.status_code == 404, query
            assert "page: pages run from 1, got" in answer.text, query
            assert "not an id" not in answer.text, query
        beyond = await client.get(f"/iterations/{iteration_id}?page=2")
        assert beyond.status_code == 404
        assert f"page: pages run from 1 to 1 for iteration {iteration_id}, got 2" in beyond.text
        for path in ("/?before=0", "/approvals?before=abc", "/missions/1?before=x"):
            answer = await client.get(path)
            assert answer.status_code == 404 and "before: " in answer.text, path
            assert "not an id" not in answer.text, path
