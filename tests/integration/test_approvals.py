"""Approvals against real PostgreSQL: a mission's ``notes_delete`` in ``ask`` parks (the note
still there, no lease held, the mission not claimed while the request is pending); the
decision (the first wins) makes it due, and the next tick deletes the note exactly once, or
tells the model who denied it; expiry, a deleted or paused mission, a passed deadline; the
webhook against a real HTTP listener; the figures the worker exports."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, DestructivePolicy, ToolContext
from planner.policy import PolicyConfig
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.fakes.webhook_server import FakeWebhook
from tests.integration.worker_harness import add_mission, iterations, make_worker, mission_row
from worker.approval_webhook import ApprovalWebhook
from worker.db.tables import approval_requests, missions, notes, tool_invocations
from worker.errors import ConflictError, NotFoundError
from worker.policy_setup import PolicySetup
from worker.queries.approval_requests import ApprovalStore
from worker.store.ledger import PostgresCallLedger
from worker.tools import builtin_tools

TTL = timedelta(hours=1)


def asking(engine: AsyncEngine, webhook: ApprovalWebhook | None = None) -> PolicySetup:
    return PolicySetup(
        default_mode="enforce",  # type: ignore[arg-type]
        config=PolicyConfig(),
        ledger=PostgresCallLedger(engine),
        default_destructive=DestructivePolicy.ASK,
        approval_ttl=TTL,
        webhook=webhook,
    )


async def a_note(engine: AsyncEngine, user: str = "u1") -> int:
    create = {t.name: t for t in builtin_tools(engine)}["notes_create"]
    made = await create.handler({"title": "old", "body": "x"}, ToolContext(user_id=user))
    return int(made["id"])


async def note_exists(engine: AsyncEngine, note_id: int) -> bool:
    async with engine.connect() as conn:
        found = await conn.execute(select(notes.c.id).where(notes.c.id == note_id))
        return found.first() is not None


class Model:
    """Deletes note ``note_id`` in round 1, answers in round 2; keeps every request."""

    def __init__(self, note_id: int) -> None:
        self.note_id = note_id
        self.requests: list[CompletionRequest] = []

    def __call__(self, request: CompletionRequest) -> CompletionResponse:
        self.requests.append(request)
        if any(m.role == "tool" for m in request.messages):
            return final_answer("Done.")
        return tool_calls(("notes_delete", {"id": self.note_id}), text="Deleting it.")


async def park(db: AsyncEngine, **kw: Any) -> tuple[int, int, Model, dict[str, Any]]:
    note_id = await a_note(db)
    mission_id = await add_mission(db, cron=None, objective="Delete the old note.")
    model = Model(note_id)
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db, **kw))
    assert await worker.run_once() == ["awaiting_approval"]
    [request] = await ApprovalStore(db).list_requests()
    return note_id, mission_id, model, request


async def deleted_calls(db: AsyncEngine) -> list[tuple[str, str]]:
    async with db.connect() as conn:
        rows = await conn.execute(
            select(tool_invocations.c.outcome, tool_invocations.c.policy_decision["reason"].astext)
            .where(tool_invocations.c.tool == "notes_delete")
            .order_by(tool_invocations.c.id)
        )
        return [(r[0], r[1]) for r in rows]


async def test_a_parked_run_holds_no_lease_and_is_not_claimed_until_decided(
    db: AsyncEngine,
) -> None:
    note_id, mission_id, model, request = await park(db)
    assert await note_exists(db, note_id)
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"], it["finished_at"] is not None) == (
        "awaiting_approval",
        "awaiting_approval",
        True,
    )
    mission = await mission_row(db, mission_id)
    assert (mission["status"], mission["lease_owner"]) == ("active", None)
    assert request["status"] == "pending" and request["arguments"] == {"id": note_id}
    assert (request["mission_id"], request["iteration_id"], request["round"]) == (
        mission_id,
        it["id"],
        1,
    )
    assert request["reply_text"] == "Deleting it." and "approve" in request["reason"]
    assert request["agent"] == "a1" and request["call_outcome"] == "parked"
    other = make_worker(db, FunctionChatModel(model), worker_id="w2", policy=asking(db))
    assert await other.run_once() == []
    assert await deleted_calls(db) == [("parked", "approval_required")]


async def test_approved_the_note_is_deleted_exactly_once_and_the_mission_finishes(
    db: AsyncEngine,
) -> None:
    note_id, mission_id, model, request = await park(db)
    store = ApprovalStore(db)
    decided = await store.decide(request["id"], approve=True, by="alice", note="old stuff")
    assert (decided["status"], decided["decided_by"], decided["decision_note"]) == (
        "approved",
        "alice",
        "old stuff",
    )
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["succeeded"]
    assert not await note_exists(db, note_id)
    assert await deleted_calls(db) == [("ok", "approved")]
    [it] = await iterations(db)
    assert (it["status"], it["attempt"], it["rounds"]) == ("succeeded", 2, 2)
    async with db.connect() as conn:  # the call ran in the attempt after the decision
        attempts = await conn.execute(
            select(tool_invocations.c.tool, tool_invocations.c.attempt).order_by("id")
        )
        assert [tuple(r) for r in attempts] == [("notes_delete", 2)]
    assert (await mission_row(db, mission_id))["status"] == "completed"
    assert (await store.get(request["id"]))["call_outcome"] == "ok"
    assert await worker.run_once() == []


async def test_denied_the_note_stays_and_the_models_next_request_carries_the_denial(
    db: AsyncEngine,
) -> None:
    note_id, _, model, request = await park(db)
    await ApprovalStore(db).decide(request["id"], approve=False, by="bob", note="keep it")
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["succeeded"]
    assert await note_exists(db, note_id)
    assert await deleted_calls(db) == [("denied", "approval_denied")]
    results = [m.content or "" for m in model.requests[-1].messages if m.role == "tool"]
    assert any("denied by bob" in r and "keep it" in r for r in results)


async def test_the_first_decision_wins_and_the_second_says_who_decided(db: AsyncEngine) -> None:
    _, _, _, request = await park(db)
    store = ApprovalStore(db)
    first, second = await asyncio.gather(
        store.decide(request["id"], approve=True, by="alice"),
        store.decide(request["id"], approve=False, by="bob"),
        return_exceptions=True,
    )
    decided = [r for r in (first, second) if isinstance(r, dict)]
    refused = [r for r in (first, second) if isinstance(r, ConflictError)]
    assert len(decided) == 1 and len(refused) == 1
    winner = decided[0]["decided_by"]
    assert f"by {winner}" in str(refused[0]) and "nothing changed" in str(refused[0])
    with pytest.raises(NotFoundError):
        await store.decide(99999, approve=True, by="alice")


async def expire(db: AsyncEngine, request_id: int) -> None:
    async with db.begin() as conn:
        await conn.execute(
            update(approval_requests)
            .where(approval_requests.c.id == request_id)
            .values(
                created_at=func.now() - text("interval '2 hours'"),
                expires_at=func.now() - text("interval '1 second'"),
            )
        )


async def test_an_expired_request_cannot_be_decided_and_counts_as_denied(db: AsyncEngine) -> None:
    note_id, _, model, request = await park(db)
    await expire(db, request["id"])
    store = ApprovalStore(db)
    assert [r["id"] for r in await store.list_requests(status="expired")] == [request["id"]]
    assert await store.list_requests(status="pending") == []
    with pytest.raises(ConflictError, match="expired"):
        await store.decide(request["id"], approve=True, by="alice")
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["succeeded"]
    assert await note_exists(db, note_id)
    assert await deleted_calls(db) == [("denied", "approval_expired")]
    results = [m.content or "" for m in model.requests[-1].messages if m.role == "tool"]
    assert any("nobody approved it in time" in r for r in results)


async def test_a_request_whose_mission_was_deleted_cannot_be_decided(db: AsyncEngine) -> None:
    _, mission_id, _, request = await park(db)
    async with db.begin() as conn:
        await conn.execute(missions.delete().where(missions.c.id == mission_id))
    store = ApprovalStore(db)
    with pytest.raises(ConflictError, match="mission was deleted"):
        await store.decide(request["id"], approve=True, by="alice")
    kept = await store.get(request["id"])  # never deleted: the audit stays
    assert kept["status"] == "expired" and "deleted" in kept["decision_note"]


async def test_a_paused_mission_keeps_its_parked_run_until_resumed(db: AsyncEngine) -> None:
    note_id, mission_id, model, request = await park(db)
    async with db.begin() as conn:
        await conn.execute(
            update(missions).where(missions.c.id == mission_id).values(status="paused")
        )
    decided = await ApprovalStore(db).decide(request["id"], approve=True, by="alice")
    assert decided["mission_status"] == "paused"
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == []
    assert await note_exists(db, note_id)
    async with db.begin() as conn:
        await conn.execute(
            update(missions).where(missions.c.id == mission_id).values(status="active")
        )
    assert await worker.run_once() == ["succeeded"]
    assert not await note_exists(db, note_id)


async def test_a_deadline_that_passed_while_parked_ends_the_run_without_the_call(
    db: AsyncEngine,
) -> None:
    note_id, mission_id, model, request = await park(db)
    await expire(db, request["id"])
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(deadline=func.now() - text("interval '1 minute'"))
        )
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["skipped"]
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"]) == ("failed", "deadline_passed")
    assert await note_exists(db, note_id)
    ended = await ApprovalStore(db).get(request["id"])
    assert ended["status"] == "expired" and "deadline" in ended["decision_note"]


async def test_the_figures_count_decisions_and_the_pending_queue(db: AsyncEngine) -> None:
    store = ApprovalStore(db)
    assert await store.stats() == ({"approved": 0, "denied": 0, "expired": 0}, 0, 0.0)
    _, _, _, request = await park(db)
    decided, pending, oldest = await store.stats()
    assert decided == {"approved": 0, "denied": 0, "expired": 0} and pending == 1
    assert 0 <= oldest < 60
    await expire(db, request["id"])
    decided, pending, oldest = await store.stats()
    assert decided["expired"] == 1 and pending == 0 and oldest == 0.0


async def test_the_webhook_gets_each_new_request_once_retried_past_a_failure(
    db: AsyncEngine,
) -> None:
    delivered = (
        REGISTRY.get_sample_value("mana_ai_approval_webhooks_total", {"outcome": "delivered"})
        or 0.0
    )
    with FakeWebhook(statuses=[503]) as hook:
        webhook = ApprovalWebhook(hook.url, max_wait_s=0.05)
        try:
            _, mission_id, _, request = await park(db, webhook=webhook)
            [first, second] = await hook.received(2)  # 503, then taken
        finally:
            await webhook.aclose(grace_s=5)
    assert first == second
    assert (second["id"], second["tool"], second["user"], second["mission_id"]) == (
        request["id"],
        "notes_delete",
        "u1",
        mission_id,
    )
    assert second["arguments"] == request["arguments"]
    assert second["target"].startswith(f"note {request['arguments']['id']} 'old'")  # read back
    assert second["decide"]["approve"] == f"mana-ai approvals approve {request['id']}"
    assert f"approvals approve {request['id']}" in second["text"]
    assert hook.headers[0]["Content-Type"] == "application/json"
    after = REGISTRY.get_sample_value("mana_ai_approval_webhooks_total", {"outcome": "delivered"})
    assert after == delivered + 1


async def test_a_webhook_that_is_down_never_holds_up_the_mission(db: AsyncEngine) -> None:
    failed = REGISTRY.get_sample_value("mana_ai_approval_webhooks_total", {"outcome": "failed"})
    webhook = ApprovalWebhook("http://127.0.0.1:9/hook", attempts=2, max_wait_s=0.01)
    try:
        note_id, _, _, request = await park(db, webhook=webhook)  # parked at once
        assert request["status"] == "pending" and await note_exists(db, note_id)
    finally:
        await webhook.aclose(grace_s=10)
    after = REGISTRY.get_sample_value("mana_ai_approval_webhooks_total", {"outcome": "failed"})
    assert after == (failed or 0.0) + 1


async def test_a_rerun_takes_a_recorded_approval_as_the_recorded_decision(
    db: AsyncEngine,
) -> None:
    from worker.admin.rerun import RerunConfig, rerun_iteration
    from worker.queries.missions import AdminStore

    _, _, model, request = await park(db)
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice")
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["succeeded"]
    iteration = await AdminStore(db).get_iteration(request["iteration_id"])
    assert [a["status"] for a in iteration["approvals"]] == ["approved"]
    config = RerunConfig(
        tools=builtin_tools(db),
        max_rounds=5,
        policy_mode="enforce",  # type: ignore[arg-type]
        policy_config=PolicyConfig(),
        user_id="u1",
        destructive=DestructivePolicy.ASK,
    )
    report = await rerun_iteration(iteration, config)
    assert report.differences == []  # the recorded approval decided it, as it did then
    [note] = report.notes  # it went on after a decision, not after a worker died
    assert "waited for an approval and went on after the decision" in note
    without = await rerun_iteration(
        iteration | {"approvals": []}, config
    )  # never asked then: asked now, and the rerun stops there
    kinds = {d["kind"] for d in without.differences}
    assert "policy" in kinds and "stop_reason" in kinds


async def test_a_slow_webhook_never_holds_up_the_park(db: AsyncEngine) -> None:
    with FakeWebhook(hold=True) as hook:
        webhook = ApprovalWebhook(hook.url)
        try:
            _, _, _, request = await park(db, webhook=webhook)  # returned: the POST still waits
            [body] = await hook.received(1)
            assert body["id"] == request["id"] and body["created_at"] is not None
            hook.release()
        finally:
            await webhook.aclose(grace_s=10)


async def test_a_deadline_passing_before_anyone_decided_ends_the_run_and_refuses_decisions(
    db: AsyncEngine,
) -> None:
    note_id, mission_id, model, request = await park(db)
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.id == mission_id)
            .values(deadline=func.now() - text("interval '1 second'"))
        )
    with pytest.raises(ConflictError, match="deadline passed"):
        await ApprovalStore(db).decide(request["id"], approve=True, by="alice")
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db))
    assert await worker.run_once() == ["skipped"]  # claimed although its request was pending
    [it] = await iterations(db)
    assert (it["status"], it["stop_reason"]) == ("failed", "deadline_passed")
    assert await note_exists(db, note_id)
    assert (await ApprovalStore(db).get(request["id"]))["status"] == "expired"


async def test_a_request_whose_arguments_were_edited_cannot_be_decided(db: AsyncEngine) -> None:
    _, _, _, request = await park(db)
    async with db.begin() as conn:
        await conn.execute(
            update(approval_requests)
            .where(approval_requests.c.id == request["id"])
            .values(arguments={"id": 12345})
        )
    store = ApprovalStore(db)
    assert (await store.get(request["id"]))["arguments_intact"] is False
    with pytest.raises(ConflictError, match="no longer match their hash"):
        await store.decide(request["id"], approve=True, by="alice")
    assert (await store.get(request["id"]))["status"] == "pending"
