"""What real-endpoint reply kinds leave in the stored iteration: the worker's chat model built
from settings, against FakeLLMServer over real HTTP, and real PostgreSQL.

The reply kinds themselves are covered in ``test_provider_zoo``; here: the status, stop reason,
error, tokens and per-round endpoint an operator reads afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fakes import FakeLLMServer, down_base_url
from tests.fakes.provider_zoo import error_in_200, reply
from tests.integration.test_tick import add_mission, iterations, make_worker, mission_row
from worker.cli import main
from worker.llm.chat_models import InstrumentedChatModel, build_chat_model
from worker.queries.missions import AdminStore
from worker.settings import load_settings


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


@pytest.fixture
async def chat_model(server: FakeLLMServer) -> AsyncIterator[Any]:
    """``build(**settings)`` → the worker's chat model for those settings; closed afterwards."""
    built: list[InstrumentedChatModel] = []

    def build(**settings: Any) -> InstrumentedChatModel:
        options: dict[str, Any] = {"llm_base_url": server.base_url, "llm_max_retries": 2}
        llm = build_chat_model(load_settings(**(options | settings)))
        built.append(llm)
        return llm

    yield build
    for llm in built:
        await llm.aclose()


async def test_a_429_inside_a_200_then_an_answer_is_a_succeeded_iteration(
    db: AsyncEngine, server: FakeLLMServer, chat_model: Any
) -> None:
    server.enqueue(json=error_in_200(429, "rate limited"))
    server.enqueue(json=reply("It is noon."))
    await add_mission(db)
    assert await make_worker(db, chat_model()).run_once() == ["succeeded"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"], it["error"]) == ("succeeded", "final_answer", None)


@pytest.mark.parametrize(
    ("body", "stop_reason", "error"),
    [
        (reply(None, finish_reason="content_filter"), "content_filtered", "filtered the answer"),
        (reply(None, finish_reason="stop"), "empty_answer", "answered with no text"),
        (reply("  ", finish_reason=None), "empty_answer", "answered with no text"),
    ],
)
async def test_a_filtered_or_empty_answer_is_a_failed_iteration_with_a_readable_reason(
    db: AsyncEngine,
    server: FakeLLMServer,
    chat_model: Any,
    body: dict[str, Any],
    stop_reason: str,
    error: str,
) -> None:
    server.enqueue(json=body)
    mission_id = await add_mission(db)
    assert await make_worker(db, chat_model()).run_once() == ["failed"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"]) == ("failed", stop_reason)
    assert error in it["error"]
    mission = await mission_row(db, mission_id)
    assert mission["status"] == "active" and mission["last_error"] == it["error"]


async def test_a_cut_answer_in_the_last_round_is_a_failed_iteration(
    db: AsyncEngine, server: FakeLLMServer, chat_model: Any
) -> None:
    for _ in range(5):  # the agent's max_rounds: every answer is cut
        server.enqueue(json=reply("Steps: 1. Read the notes 2. Call the", finish_reason="length"))
    await add_mission(db)
    assert await make_worker(db, chat_model()).run_once() == ["failed"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"], it["rounds"]) == ("failed", "truncated", 5)
    notes = [m for m in it["messages"] if m["role"] == "user"][1:]
    assert len(notes) == 4 and "cut off" in notes[0]["content"]


async def test_estimated_usage_is_stored_and_trips_the_daily_budget(
    db: AsyncEngine, server: FakeLLMServer, chat_model: Any
) -> None:
    server.enqueue(json=reply("It is noon.", usage=None))
    admin = AdminStore(db)
    await admin.add_agent(
        name="a1", owner_user_id="u1", system_prompt="Be brief.", max_tokens_per_day=20
    )
    await add_mission(db)
    worker = make_worker(db, chat_model())
    assert await worker.run_once() == ["succeeded"]
    [first] = await iterations(db)
    assert first["prompt_tokens"] + first["completion_tokens"] > 20  # estimated, not 0
    assert first["messages"][-1]["reply_info"]["usage"]["estimated"] is True

    await add_mission(db)
    assert await worker.run_once() == ["failed"]
    second = (await iterations(db))[1]
    assert second["stop_reason"] == "budget_exhausted"


async def test_a_trickling_body_fails_the_iteration_at_the_timeout(
    db: AsyncEngine, server: FakeLLMServer, chat_model: Any
) -> None:
    server.enqueue(json=reply("It is noon."), trickle_s=0.05)
    server.unused_ok = True  # on a loaded machine the deadline may pass before it is served
    await add_mission(db)
    llm = chat_model(llm_timeout_s=0.25, llm_max_retries=0)
    assert await make_worker(db, llm).run_once() == ["failed"]
    [it] = await iterations(db)
    assert it["stop_reason"] == "llm_error"
    assert "did not answer within 0.25 s (after 1 attempt)" in it["error"]


async def test_an_answer_over_the_cap_fails_the_iteration_naming_the_limit(
    db: AsyncEngine, server: FakeLLMServer, chat_model: Any
) -> None:
    server.enqueue(json=reply(calls=[("clock_now", {})]))
    server.enqueue_flood(200_000_000, content_length=False)
    mission_id = await add_mission(db)
    assert await make_worker(db, chat_model()).run_once() == ["failed"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"], it["rounds"]) == ("failed", "llm_error", 2)
    assert (
        "sent an answer larger than MANA_AI_LLM_MAX_RESPONSE_BYTES (8388608 bytes), reading "
        "stopped at the limit (after 1 attempt; not retried)" in it["error"]
    )
    assert len(server.requests) == 2  # the first round's, and one attempt of the second
    assert [m["role"] for m in it["messages"]][-2:] == ["assistant", "tool"]  # round 1 kept
    assert (await mission_row(db, mission_id))["last_error"] == it["error"]


async def test_the_fallback_answers_and_each_round_records_who_answered(
    db: AsyncEngine,
    server: FakeLLMServer,
    chat_model: Any,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server.enqueue(json=reply(calls=[("clock_now", {})]))
    server.enqueue(json=reply("It is noon."))
    llm = chat_model(
        llm_base_url=down_base_url(),
        llm_max_retries=0,
        llm_fallback_base_url=server.base_url,
        llm_fallback_model="fallback-model",
        llm_fallback_api_key="sk-fallback",
    )
    await add_mission(db)
    assert await make_worker(db, llm).run_once() == ["succeeded"]
    [it] = await iterations(db)
    endpoints = [m["reply_info"]["endpoint"] for m in it["messages"] if "reply_info" in m]
    assert endpoints == ["fallback", "fallback"]
    assert [r["model"] for r in server.requests] == ["fallback-model", "fallback-model"]
    assert server.headers[0]["Authorization"] == "Bearer sk-fallback"

    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    assert await asyncio.to_thread(main, ["iterations", "show", "latest"]) == 0
    shown = capsys.readouterr().out
    assert "[assistant via fallback] It is noon." in shown
    assert "[assistant via fallback] calls clock_now({})" in shown


async def test_an_answer_with_a_header_no_client_parses_is_a_failed_iteration_not_a_crash(
    db: AsyncEngine, server: FakeLLMServer, chat_model: Any
) -> None:
    # was failed / crashed / "internal error: ClientResponseError: 400, …" with a traceback
    server.enqueue_header_flood(value_bytes=9000)
    mission_id = await add_mission(db)
    assert await make_worker(db, chat_model()).run_once() == ["failed"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"]) == ("failed", "llm_error")
    assert "sent an answer that is not valid HTTP (Got more than 8190 bytes" in it["error"]
    assert it["error"].endswith("(after 1 attempt; not retried)")
    assert len(server.requests) == 1
    assert (await mission_row(db, mission_id))["last_error"] == it["error"]
