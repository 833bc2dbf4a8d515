"""An approved call is never spent by a crash (issue 31, item 3), against real PostgreSQL.

A person approved a mission's ``notes_delete``; the worker that goes on with the run is killed
at each of its database round trips in turn (``FlakyProxy.die_at``: the round trip cut before
the server gets it, or its answer lost after the server committed it, then nothing more gets
through), and another worker takes the run over once the lease expired. Whatever the round
trip: the note is deleted exactly once (the call's record says ``ok`` with what it deleted:
a second delete would have found no note), the iteration succeeds, nobody is asked again, and
the model never reads that the call's outcome is unknown: a built-in tool's effect commits
with its journal record (``ToolSpec.effect``, ``MissionStore.run_effect``).

For a tool whose effect lives elsewhere (an MCP server, the web), an approved call found in
flight is not reported as done and its approval stays usable for exactly that call: the
model may call it again, with the same arguments, without asking a person again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import CompletionRequest, CompletionResponse, ToolContext, ToolSpec
from planner.testing import FunctionChatModel, final_answer, tool_calls
from tests.fakes.db_proxy import FlakyProxy
from tests.integration.test_approvals import Model, a_note, asking, note_exists
from tests.integration.worker_harness import add_mission, iterations, make_worker
from worker.db.engine import create_engine
from worker.db.tables import approval_requests, missions, tool_invocations
from worker.queries.approval_requests import ApprovalStore
from worker.run import ending as runner_module


async def parked_and_approved(db: AsyncEngine) -> tuple[int, Model]:
    """A one-shot mission whose run parked at ``notes_delete`` of a new note, approved."""
    note_id = await a_note(db)
    await add_mission(db, cron=None, objective="Delete the old note.")
    model = Model(note_id)
    assert await make_worker(db, FunctionChatModel(model), policy=asking(db)).run_once() == [
        "awaiting_approval"
    ]
    [request] = await ApprovalStore(db).list_requests()
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice")
    return note_id, model


async def run_killed(
    db: AsyncEngine, database_url: str, model: Model, die_at: int | None, lose: bool
) -> int:
    """Run the approved mission on a worker whose connections go through a proxy that kills
    it at round trip ``die_at`` (``None``: never); the round trips it made."""
    async with FlakyProxy(database_url) as proxy:
        if die_at is not None:
            proxy.die_at(die_at, lose_answer=lose)
        engine = create_engine(proxy.url_for(database_url))
        try:
            worker = make_worker(engine, FunctionChatModel(model), policy=asking(engine))
            run = asyncio.create_task(worker.run_once())
            died = asyncio.create_task(proxy.died.wait())
            await asyncio.wait({run, died}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():  # killed: nothing it does from now on reaches the database
                run.cancel()
            with contextlib.suppress(BaseException):
                await run
            died.cancel()
        finally:
            await engine.dispose()
        return proxy.round_trips


async def taken_over(db: AsyncEngine, model: Model) -> list[str]:
    """Another worker, once the dead one's lease expired: its runs until nothing is due."""
    async with db.begin() as conn:
        await conn.execute(
            update(missions)
            .where(missions.c.lease_owner.is_not(None))
            .values(lease_expires_at=text("now() - interval '1 second'"))
        )
    worker = make_worker(db, FunctionChatModel(model), policy=asking(db), worker_id="w2")
    outcomes: list[str] = []
    for _ in range(5):
        ran = await worker.run_once()
        if not ran:
            return outcomes
        outcomes += ran
    raise AssertionError(f"still running: {outcomes}")


async def deleted_once_and_approval_kept(db: AsyncEngine, note_id: int, model: Model) -> None:
    assert not await note_exists(db, note_id)
    async with db.connect() as conn:
        calls = (
            await conn.execute(
                select(tool_invocations.c.outcome, tool_invocations.c.result).where(
                    tool_invocations.c.tool == "notes_delete"
                )
            )
        ).all()
        requests = (await conn.execute(select(approval_requests.c.status))).scalars().all()
    assert [(outcome, (result or {}).get("deleted")) for outcome, result in calls] == [
        ("ok", note_id)
    ]
    assert requests == ["approved"]  # nobody was asked again
    [it] = await iterations(db)
    assert it["status"] == "succeeded", it
    read = [m.content or "" for r in model.requests for m in r.messages if m.role == "tool"]
    assert not any("unknown" in text_ for text_ in read), read


async def test_an_approved_built_in_write_happens_exactly_once_whatever_round_trip_kills_it(
    db: AsyncEngine,
    database_url: str,
    emptying_script: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a killed worker stores nothing more: no waiting out its cleanup
    monkeypatch.setattr(runner_module, "SHUTDOWN_STORE_S", 0.05)

    async def empty() -> None:
        async with db.connect() as conn:  # as the db fixture empties the tables
            raw = await conn.get_raw_connection()
            await raw.driver_connection.execute(emptying_script)  # type: ignore[union-attr]
            await conn.commit()

    note_id, model = await parked_and_approved(db)
    round_trips = await run_killed(db, database_url, model, None, False)
    assert await taken_over(db, model) == []  # the clean run ended it
    await deleted_once_and_approval_kept(db, note_id, model)
    assert round_trips >= 5
    for n in range(1, round_trips + 1):
        for lose in (False, True):
            await empty()
            note_id, model = await parked_and_approved(db)
            await run_killed(db, database_url, model, n, lose)
            await taken_over(db, model)
            try:
                await deleted_once_and_approval_kept(db, note_id, model)
            except AssertionError as exc:
                raise AssertionError(f"killed at round trip {n} (answer lost: {lose})") from exc


@pytest.mark.parametrize("then", ["calls it again", "calls another", "gives up"])
async def test_an_approved_call_of_unknown_outcome_is_not_done_and_its_approval_still_stands(
    db: AsyncEngine, database_url: str, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A tool whose effect the worker cannot see (here a handler that records its calls),
    killed while it runs: the takeover reports its outcome unknown; exactly that call, called
    again, runs on the same approval; another call is asked about; and when the model does
    neither, the iteration says the approved call was not confirmed."""
    monkeypatch.setattr(runner_module, "SHUTDOWN_STORE_S", 0.05)
    runs: list[dict[str, Any]] = []
    entered = asyncio.Event()

    async def wipe(args: dict[str, Any], ctx: ToolContext) -> str:
        runs.append(args)
        entered.set()
        if len(runs) == 1:
            await asyncio.Event().wait()  # the worker dies while it runs
        return "wiped"

    tool = ToolSpec(
        name="wipe",
        description="Wipe a disk (elsewhere).",
        input_schema={"type": "object", "properties": {"disk": {"type": "string"}}},
        policy_hint="destructive",
        handler=wipe,
    )
    second = {"calls it again": {"disk": "d1"}, "calls another": {"disk": "d2"}}.get(then)

    def respond(request: CompletionRequest) -> CompletionResponse:
        results = [m for m in request.messages if m.role == "tool"]
        if not results:
            return tool_calls(("wipe", {"disk": "d1"}))
        if len(results) == 1 and second is not None:  # told the outcome is unknown
            return tool_calls(("wipe", second))
        return final_answer("Done.")

    await add_mission(db, cron=None, objective="Wipe d1.")
    worker = make_worker(db, FunctionChatModel(respond), extra_tools=[tool], policy=asking(db))
    assert await worker.run_once() == ["awaiting_approval"]
    [request] = await ApprovalStore(db).list_requests()
    await ApprovalStore(db).decide(request["id"], approve=True, by="alice")
    async with FlakyProxy(database_url) as proxy:
        engine = create_engine(proxy.url_for(database_url))
        dying = make_worker(
            engine, FunctionChatModel(respond), extra_tools=[tool], policy=asking(engine)
        )
        run = asyncio.create_task(dying.run_once())
        await entered.wait()
        await proxy.outage(3600)  # killed while the approved call runs
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
        await engine.dispose()
    async with db.begin() as conn:
        await conn.execute(
            update(missions).values(lease_expires_at=text("now() - interval '1 second'"))
        )
    worker = make_worker(db, FunctionChatModel(respond), extra_tools=[tool], policy=asking(db))
    outcomes = await worker.run_once()
    async with db.connect() as conn:
        rows = [
            tuple(r)
            for r in await conn.execute(
                select(
                    tool_invocations.c.arguments,
                    tool_invocations.c.outcome,
                    tool_invocations.c.policy_decision["reason"].astext,
                ).order_by(tool_invocations.c.id)
            )
        ]
    unknown = ({"disk": "d1"}, "unknown", "approved")  # not reported as done
    [it] = await iterations(db)
    if then == "calls it again":  # on the approval that stood: no one asked again
        assert outcomes == ["succeeded"] and runs == [{"disk": "d1"}, {"disk": "d1"}]
        assert rows == [unknown, ({"disk": "d1"}, "ok", "approved")]
        assert len(await ApprovalStore(db).list_requests()) == 1
        assert it["error"] is None
    elif then == "calls another":  # not what was approved: a person is asked
        assert outcomes == ["awaiting_approval"] and runs == [{"disk": "d1"}]
        assert rows == [unknown, ({"disk": "d2"}, "parked", "approval_required")]
    else:
        assert outcomes == ["succeeded"] and runs == [{"disk": "d1"}]
        assert rows == [unknown]
        assert "wipe was approved" in it["error"] and "not used up" in it["error"]
