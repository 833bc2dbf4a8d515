"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright; no
browser is ever downloaded): sign in, open a compacted iteration and expand its compaction,
approve a request in the inbox and see the mission resume; stored scripts never run; pages fit
a phone. With ``CONSOLE_SCREENSHOTS_DIR`` set, the main pages are saved there as PNG
(``docs/screenshots`` holds the ones the docs site shows: the tutorial's console page, the
approvals how-to).

Skipped, saying why, where Chromium is not installed (``apt-get install chromium``)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, TokenUsage
from planner.compaction import SUMMARY_PROMPT
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.integration.api_harness import app_for, token
from tests.integration.test_approvals import Model, a_note, asking
from tests.integration.worker_harness import make_worker, policy_setup
from worker.asgi_server import AsgiServer
from worker.queries.admin_tokens import AdminTokenStore
from worker.queries.approval_requests import ApprovalStore
from worker.queries.missions import AdminStore
from worker.run.compaction_setup import CompactionSetup
from worker.tools import builtin_tools

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"
)

FLAGS = [
    "--headless=new",
    "--no-sandbox",  # as root in CI's container
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS_DIR")


@pytest.fixture
async def server(db: AsyncEngine, database_url: str) -> AsyncIterator[str]:
    """``mana-ai serve``'s app on a free port of 127.0.0.1; its base URL."""
    served = AsgiServer(app_for(db, database_url), "127.0.0.1", 0)
    task = asyncio.create_task(served.serve())
    try:
        while not served.started:  # noqa: ASYNC110 - uvicorn has no started event
            await asyncio.sleep(0.01)
        yield served.base_url
    finally:
        served.stop()
        await task


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def page_of(browser: Any, *, phone: bool = False) -> Any:
    size = {"width": 390, "height": 844} if phone else {"width": 1280, "height": 900}
    context = await browser.new_context(viewport=size, device_scale_factor=1)
    page = await context.new_page()
    page.dialogs = []
    page.failures = []
    page.on(
        "dialog", lambda d: (page.dialogs.append(d.message), asyncio.ensure_future(d.dismiss()))
    )
    page.on("pageerror", lambda e: page.failures.append(str(e)))
    page.on(
        "console",
        lambda m: page.failures.append(m.text) if m.type == "error" else None,
    )
    return page


async def sign_in(page: Any, base: str, value: str) -> None:
    await page.goto(f"{base}/")
    assert page.url.startswith(f"{base}/login")
    await page.fill("#token", value)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/")


async def shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        await asyncio.to_thread(Path(SCREENSHOTS).mkdir, parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def showcase_model() -> FunctionChatModel:
    """Four rounds of calls (two reads side by side, a write, a destructive call that fails)
    whose usage climbs past 92 % of a 2,000-token context (a compaction, then its
    reminder), a summary, and an answer."""
    rounds = iter((400, 800, 1200, 1700))

    def answer(request: CompletionRequest) -> CompletionResponse:
        if request.messages and request.messages[0].content == SUMMARY_PROMPT:
            return final_answer("Facts found: the clock was read twice, a note was written.")
        prompt_tokens = next(rounds, None)
        if prompt_tokens is None:
            return final_answer("It is 12:00; the note is written.")
        usage = TokenUsage(prompt_tokens=prompt_tokens, completion_tokens=160)
        return tool_calls(
            ("clock_now", {}),
            ("notes_list", {"limit": 5}),
            ("notes_create", {"title": "the time", "body": "noted"}),
            ("notes_delete", {"id": 999_999}),
            usage=usage,
            text="Reading the clock and my notes, then writing the time down.",
        )

    return FunctionChatModel(answer)


async def compacted_iteration(db: AsyncEngine) -> int:
    """A mission run that called tools over four rounds, compacted, was reminded, answered."""
    admin = AdminStore(db)
    agent = await admin.add_agent(
        name="scribe",
        owner_user_id="u1",
        system_prompt="Note the time, then answer.",
        max_rounds=8,
        compact_max_ctx=2000,
    )
    await admin.add_mission(
        agent_id=agent["id"],
        objective="Note the time and say what you did.",
        cron=None,
        timezone="UTC",
        next_run_at="now",
    )
    llm = showcase_model()
    wanted = ("clock_now", "notes_list", "notes_create", "notes_delete")
    tools = [t for t in builtin_tools(db) if t.name in wanted]
    worker = make_worker(
        db,
        llm,
        policy=policy_setup(db, "log-only"),
        compaction=CompactionSetup(llm=llm, max_ctx=10**6),
        tools_for=lambda mission: tools,
    )
    assert await worker.run_once() == ["succeeded"]
    [it] = await admin.list_iterations(limit=1)
    return int(it["id"])


async def test_sign_in_open_a_compacted_iteration_and_expand_its_compaction(
    db: AsyncEngine, server: str, browser: Any
) -> None:
    iteration_id = await compacted_iteration(db)
    page = await page_of(browser)
    await sign_in(page, server, await token(db))
    await shot(page, "missions")
    await page.click(f"a[href='/iterations/{iteration_id}']")
    await page.wait_for_url(f"{server}/iterations/{iteration_id}")
    compaction = page.locator("details.compaction").first
    assert await compaction.get_attribute("open") is None
    folded = compaction.locator(".folded")
    assert not await folded.is_visible()
    await compaction.locator(":scope > summary").click()
    assert await folded.is_visible()
    assert await folded.locator(".round .call").count() >= 1  # the folded turns, restored
    assert await page.locator(".calls.parallel").count() >= 1  # reads drawn side by side
    assert await page.locator(".chip.reminder").count() >= 1  # reminders as chips
    assert "policy" in await page.locator(".call .decision").first.inner_text()
    await shot(page, "iteration-timeline")
    await page.click("text=Rerun with today's rules")
    await page.wait_for_selector("#rerun .report")
    assert "rerun of iteration" in await page.inner_text("#rerun")
    await page.click("nav >> text=Policy")
    assert "would have denied" in await page.inner_text("main")
    assert await page.locator("svg.chart rect").count() >= 2
    await shot(page, "policy")
    assert page.dialogs == [] and page.failures == []


async def test_approve_a_request_in_the_inbox_and_see_the_mission_resume(
    db: AsyncEngine, server: str, browser: Any
) -> None:
    note_id = await a_note(db)
    admin = AdminStore(db)
    agent = await admin.add_agent(name="tidy", owner_user_id="u1", system_prompt="Be tidy.")
    mission = await admin.add_mission(
        agent_id=agent["id"],
        objective="Delete the old note.",
        cron=None,
        timezone="UTC",
        next_run_at="now",
    )
    model = Model(note_id)
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["awaiting_approval"]
    page = await page_of(browser)
    await sign_in(page, server, await token(db, "ops"))
    assert "awaiting approval" in await page.inner_text("main")
    await page.click("nav >> text=Approvals")
    row = page.locator("article.approval").first
    assert "notes_delete" in await row.inner_text()
    await shot(page, "approvals")
    await row.locator("input[name=note]").first.fill("old stuff")
    await row.locator("button", has_text="Approve").click()
    await page.wait_for_selector("article.approval .decided >> text=approved by ops")
    assert await worker.run_once() == ["succeeded"]  # the parked run went on
    await page.goto(f"{server}/missions/{mission['id']}")
    text = await page.inner_text("main")
    assert "completed" in text and "succeeded" in text
    assert page.dialogs == [] and page.failures == []


async def test_a_click_that_fails_says_why_at_the_top(
    db: AsyncEngine, database_url: str, browser: Any
) -> None:
    """A session revoked behind the page: the server's 403 is shown; the server gone: the
    console says it could not reach it (never a button that silently does nothing)."""
    note_id = await a_note(db)
    admin = AdminStore(db)
    agent = await admin.add_agent(name="tidy", owner_user_id="u1", system_prompt="Be tidy.")
    await admin.add_mission(
        agent_id=agent["id"], objective="Delete.", cron=None, timezone="UTC", next_run_at="now"
    )
    worker = make_worker(db, FunctionChatModel(Model(note_id)), policy=asking(db))
    assert await worker.run_once() == ["awaiting_approval"]
    served = AsgiServer(app_for(db, database_url), "127.0.0.1", 0)
    task = asyncio.create_task(served.serve())
    while not served.started:  # noqa: ASYNC110 - uvicorn has no started event
        await asyncio.sleep(0.01)
    page = await page_of(browser)
    await sign_in(page, served.base_url, await token(db, "ops"))
    await page.goto(f"{served.base_url}/approvals")
    tokens = AdminTokenStore(db)
    [row] = await tokens.list_tokens()
    await tokens.revoke_token(row["id"])
    await page.locator("button", has_text="Approve").first.click()
    await page.wait_for_selector("#flash >> text=not signed in")
    served.stop()
    await task
    await page.locator("button", has_text="Deny").first.click()
    await page.wait_for_selector("#flash >> text=could not reach the server")
    assert "not signed in" not in await page.inner_text("#flash")  # the old notice is gone
    [request] = await ApprovalStore(db).list_requests()
    assert request["status"] == "pending"  # neither click decided anything


async def test_stored_scripts_never_run_in_the_page(
    db: AsyncEngine, server: str, browser: Any
) -> None:
    hostile = '<script>alert("objective")</script><img src=x onerror="alert(\'img\')">'
    admin = AdminStore(db)
    agent = await admin.add_agent(name="x", owner_user_id="u1", system_prompt="s")
    await admin.add_mission(
        agent_id=agent["id"], objective=hostile, cron=None, timezone="UTC", next_run_at="now"
    )

    def model(request: Any) -> Any:
        if any(m.role == "tool" for m in request.messages):
            return final_answer(hostile)
        return tool_calls(("clock_now", {}), text=hostile)

    assert await make_worker(db, FunctionChatModel(model)).run_once() == ["succeeded"]
    page = await page_of(browser)
    await sign_in(page, server, await token(db))
    for path in ("/", "/missions/1", "/iterations/1"):
        await page.goto(f"{server}{path}")
        assert hostile.split(">")[0] in await page.inner_text("main")  # shown as text
    assert await page.evaluate("document.querySelectorAll('main img, main script').length") == 0
    assert page.dialogs == []


async def test_the_pages_fit_a_phone(db: AsyncEngine, server: str, browser: Any) -> None:
    iteration_id = await compacted_iteration(db)
    page = await page_of(browser, phone=True)
    await sign_in(page, server, await token(db))
    for path in ("/", f"/iterations/{iteration_id}", "/approvals", "/policy"):
        await page.goto(f"{server}{path}")
        wide = await page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390 + 1, f"{path} is {wide}px wide on a 390px screen"
    await page.goto(f"{server}/iterations/{iteration_id}")
    await shot(page, "iteration-phone")


async def test_on_a_phone_cards_are_as_tall_as_their_content_and_lists_are_readable(
    db: AsyncEngine, server: str, browser: Any
) -> None:
    """At 390 px: a card of reads that ran side by side ends where its content ends (a
    flex-basis meant as a width must not become a height in the column layout), and the
    missions and iterations lists are stacked cards whose cells (the objective) get the
    screen's width, with nothing scrolling sideways."""
    iteration_id = await compacted_iteration(db)
    page = await page_of(browser, phone=True)
    await sign_in(page, server, await token(db))
    await page.goto(f"{server}/iterations/{iteration_id}")
    gaps = await page.evaluate(
        """() => [...document.querySelectorAll('.calls .call')].map(card => {
             const box = card.getBoundingClientRect();
             const last = card.lastElementChild.getBoundingClientRect();
             return {height: box.height, gap: box.bottom - last.bottom};
           })"""
    )
    assert gaps and await page.locator(".calls.parallel .call").count() >= 2
    for card in gaps:  # padding and border only below the last line of a card
        assert card["gap"] <= 16, gaps
    for path, cell in (("/", "Objective"), ("/missions/1", "Stop reason")):
        await page.goto(f"{server}{path}")
        width = await page.evaluate(
            f"""() => document.querySelector('table.grid td[data-label="{cell}"]')
                        .getBoundingClientRect().width"""
        )
        assert width >= 300, f"{path}: the {cell} cell is {width}px wide on a 390px screen"
        wide = await page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390 + 1, f"{path} is {wide}px wide"
    desktop = await page_of(browser)
    await sign_in(desktop, server, await token(db, "desk"))
    await desktop.goto(f"{server}/iterations/{iteration_id}")
    side_by_side = await desktop.evaluate(
        """() => [...document.querySelector('.calls.parallel').querySelectorAll('.call')]
                 .map(card => card.getBoundingClientRect().top)"""
    )
    assert len(set(side_by_side)) == 1, side_by_side  # a row on a wide screen
    assert page.failures == [] and desktop.failures == []


async def test_after_run_now_the_mission_page_shows_the_run_without_a_reload(
    db: AsyncEngine, server: str, browser: Any
) -> None:
    """Run now, then a worker runs the mission: the page the button went back to shows the
    iteration and its outcome by itself (it follows what runs), then stops following."""
    admin = AdminStore(db)
    agent = await admin.add_agent(name="clock", owner_user_id="u1", system_prompt="Tell time.")
    mission = await admin.add_mission(
        agent_id=agent["id"], objective="What time is it?", cron="0 9 * * *", timezone="UTC",
        next_run_at=datetime(2999, 1, 1, 9, tzinfo=UTC),
    )  # fmt: skip
    page = await page_of(browser)
    await sign_in(page, server, await token(db, "ops"))
    await page.goto(f"{server}/missions/{mission['id']}")
    assert await page.locator("#live[hx-trigger]").count() == 0  # nothing runs: no polling
    await page.click("button:has-text('Run now')")
    await page.wait_for_selector("#live[hx-trigger]")
    assert await page.locator("table.grid a[href^='/iterations/']").count() == 0
    worker = make_worker(db, FunctionChatModel(lambda request: final_answer("Noon.")))
    assert await worker.run_once() == ["succeeded"]
    await page.wait_for_selector("table.grid a[href^='/iterations/']", timeout=10_000)
    assert "succeeded" in await page.inner_text("#live")
    await page.wait_for_selector("#live:not([hx-trigger])", timeout=10_000)  # stopped
    assert page.dialogs == [] and page.failures == []


async def test_a_phone_never_scrolls_sideways_on_policy_or_a_made_up_tool_name(
    db: AsyncEngine, server: str, browser: Any
) -> None:
    """At 390, 360 and 320 px: the policy report (its six-column "By mode" table, a reason
    naming a made-up tool) and an iteration whose model called a 3,000-character tool name it
    made up stay within the screen (long names wrap; a wide table scrolls in its own box)."""
    await compacted_iteration(db)  # log-only decisions: the policy page has its tables
    admin = AdminStore(db)
    agent = await admin.add_agent(name="inventor", owner_user_id="u1", system_prompt="s")
    await admin.add_mission(
        agent_id=agent["id"], objective="Use a tool.", cron=None, timezone="UTC",
        next_run_at="now",
    )  # fmt: skip
    invented = "frobnicate" * 300

    def model(request: Any) -> Any:
        if any(m.role == "tool" for m in request.messages):
            return final_answer(f"I called {invented}.")
        return tool_calls((invented, {"path": "/" + "x" * 400}))

    worker = make_worker(db, FunctionChatModel(model), policy=policy_setup(db, "log-only"))
    assert await worker.run_once() == ["succeeded"]
    [iteration] = await admin.list_iterations(limit=1)
    page = await page_of(browser, phone=True)
    await sign_in(page, server, await token(db))
    for width in (390, 360, 320):
        await page.set_viewport_size({"width": width, "height": 844})
        for path in ("/policy", f"/iterations/{iteration['id']}"):
            await page.goto(f"{server}{path}")
            wide = await page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"{path} is {wide}px wide on a {width}px screen"
    assert "frobnicatefrobnicate" in await page.inner_text(".call .tool")
    assert page.failures == []
