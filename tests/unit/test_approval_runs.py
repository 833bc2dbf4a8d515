"""Approvals in mission runs, on the in-memory store: a destructive call in ``ask`` parks the
iteration (no lease held, the mission not claimed while the request is pending), and the next
run after a decision goes on from the checkpoint: approved, exactly the reviewed call runs,
once; denied or expired, the model reads who decided and is told not to retry; the run's
deadline, the agent's tools and a crash after the approval are taken into account."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from planner import CompletionRequest, CompletionResponse, DestructivePolicy, ToolContext, ToolSpec
from planner.policy import PolicyConfig
from planner.testing import FunctionChatModel, final_answer, tool_calls
from worker.daemon.worker import Worker
from worker.policy_setup import PolicySetup
from worker.run.runner import MissionRunner
from worker.store.memory import InMemoryMissionStore

LEASE = timedelta(seconds=30)
TTL = timedelta(hours=1)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


class Notes:
    """``list`` (read) and ``delete`` (destructive), recording every delete that ran."""

    def __init__(self) -> None:
        self.deleted: list[tuple[int, ToolContext]] = []
        self.block: asyncio.Event | None = None

    async def list(self, args: dict[str, Any], ctx: ToolContext) -> list[int]:
        return [7, 8]

    async def delete(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        self.deleted.append((int(args["id"]), ctx))
        if self.block is not None:
            await self.block.wait()
        return {"deleted": args["id"]}

    def specs(self, *, with_delete: bool = True) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
        specs = [ToolSpec("notes_list", "List.", {"type": "object"}, "read", self.list)]
        if with_delete:
            specs.append(ToolSpec("notes_delete", "Delete.", schema, "destructive", self.delete))
        return specs


class Webhook:
    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []

    def notify(self, request: dict[str, Any]) -> None:
        self.notices.append(request)


class Setup:
    def __init__(
        self,
        *,
        destructive: str = "ask",
        mode: str = "enforce",
        agent_destructive: str | None = None,
        deadline: datetime | None = None,
        cron: str | None = None,
    ) -> None:
        self.clock = Clock()
        self.store = InMemoryMissionStore(clock=self.clock)
        self.notes = Notes()
        self.webhook = Webhook()
        agent = self.store.add_agent("cleaner", destructive_policy=agent_destructive)
        self.mission_id = self.store.add_mission(
            agent, objective="Delete note 7.", deadline=deadline, cron=cron
        )
        self.policy = PolicySetup(
            default_mode=mode,  # type: ignore[arg-type]
            config=PolicyConfig(),
            ledger=self.store,
            default_destructive=DestructivePolicy(destructive),
            approval_ttl=TTL,
            webhook=self.webhook,  # type: ignore[arg-type]
        )
        self.requests: list[CompletionRequest] = []

    def worker(
        self, *, with_delete: bool = True, worker_id: str = "w1", tracing: Any = None
    ) -> Worker:
        """A worker running the mission (``tracing``: a ``RunTracer``, or none)."""
        tools = self.notes.specs(with_delete=with_delete)
        runner = MissionRunner(
            tracing=tracing,
            store=self.store,
            llm=FunctionChatModel(self.model),
            tools_for=lambda m: tools,
            worker_id=worker_id,
            lease=LEASE,
            policy=self.policy,
            clock=self.clock,
        )
        return Worker(
            store=self.store,
            runner=runner,
            worker_id=worker_id,
            max_concurrent_missions=2,
            lease=LEASE,
        )

    def model(self, request: CompletionRequest) -> CompletionResponse:
        """List, then delete note 7, then answer."""
        self.requests.append(request)
        results = [m for m in request.messages if m.role == "tool"]
        if not results:
            return tool_calls(
                ("notes_list", {}), ("notes_delete", {"id": 7}), text="Deleting note 7."
            )
        return final_answer("Done.")

    @property
    def iteration(self) -> dict[str, Any]:
        [it] = self.store.iterations.values()
        return it

    def rows(self) -> list[tuple[str, str, str | None]]:
        return [
            (r["tool"], r["outcome"], (r["policy_decision"] or {}).get("reason"))
            for r in self.store.invocations_of(self.iteration["id"])
        ]


async def parked(s: Setup) -> dict[str, Any]:
    assert await s.worker().run_once() == ["awaiting_approval"]
    [request] = s.store.approvals
    return request


async def test_ask_parks_the_iteration_without_a_lease_and_asks_once() -> None:
    s = Setup()
    request = await parked(s)
    it = s.iteration
    assert (it["status"], it["stop_reason"], it["rounds"]) == (
        "awaiting_approval",
        "awaiting_approval",
        1,
    )
    assert s.notes.deleted == []
    assert s.rows() == [
        ("notes_list", "ok", "allowed"),
        ("notes_delete", "parked", "approval_required"),
    ]
    mission = s.store.missions[s.mission_id]
    assert (mission["status"], mission["lease_owner"]) == ("active", None)
    assert request["status"] == "pending" and request["tool"] == "notes_delete"
    assert request["arguments"] == {"id": 7} and request["reply_text"] == "Deleting note 7."
    assert (request["round"], request["position"], request["user_id"]) == (1, 1, "u1")
    assert request["expires_at"] == s.clock.now + TTL
    assert [n["id"] for n in s.webhook.notices] == [request["id"]]
    # pending: no worker claims the mission, however often it ticks
    s.clock.now += timedelta(minutes=5)
    assert await s.worker(worker_id="w2").run_once() == []
    assert len(s.store.approvals) == 1 and len(s.webhook.notices) == 1


async def test_approved_the_reviewed_call_runs_once_and_the_mission_finishes() -> None:
    s = Setup()
    request = await parked(s)
    s.store.decide(request["id"], "approved", by="alice", note="fine")
    assert await s.worker().run_once() == ["succeeded"]
    [(note, ctx)] = s.notes.deleted
    assert note == 7 and ctx.approval is not None and ctx.approval.decided_by == "alice"
    it = s.iteration
    assert (it["status"], it["attempt"], it["rounds"]) == ("succeeded", 2, 2)
    assert s.rows() == [("notes_list", "ok", "allowed"), ("notes_delete", "ok", "approved")]
    ran_in = [r["attempt"] for r in s.store.invocations_of(it["id"])]
    assert ran_in == [1, 2]  # the approved call belongs to the attempt that ran it
    assert s.store.missions[s.mission_id]["status"] == "completed"
    assert len(s.requests) == 2  # the model was not asked again for round 1
    assert await s.worker().run_once() == []  # nothing left to run; never twice
    assert len(s.notes.deleted) == 1


async def test_denied_the_model_reads_who_denied_it_and_is_told_not_to_retry() -> None:
    s = Setup()
    request = await parked(s)
    s.store.decide(request["id"], "denied", by="bob", note="keep it")
    assert await s.worker().run_once() == ["succeeded"]
    assert s.notes.deleted == []
    assert s.rows() == [
        ("notes_list", "ok", "allowed"),
        ("notes_delete", "denied", "approval_denied"),
    ]
    last = s.requests[-1]
    results = [m.content or "" for m in last.messages if m.role == "tool"]
    assert any("denied by bob (approval" in r and "keep it" in r for r in results)
    reminders = [m.content or "" for m in last.messages if m.role == "system"][1:]
    assert any("do not call it again" in r for r in reminders)


async def test_an_unanswered_request_expires_and_counts_as_denied() -> None:
    s = Setup()
    request = await parked(s)
    s.clock.now += TTL + timedelta(seconds=1)
    assert await s.worker().run_once() == ["succeeded"]
    assert s.notes.deleted == []
    assert request["status"] == "expired" and request["decided_at"] == request["expires_at"]
    assert s.rows()[-1] == ("notes_delete", "denied", "approval_expired")


async def test_an_approved_call_whose_tool_the_agent_no_longer_offers_is_not_run() -> None:
    s = Setup()
    request = await parked(s)
    s.store.decide(request["id"], "approved")
    assert await s.worker(with_delete=False).run_once() == ["succeeded"]
    assert s.notes.deleted == []
    assert s.rows()[-1] == ("notes_delete", "denied", "tool_not_offered")


async def test_a_run_stopped_while_the_approved_call_ran_never_runs_it_again() -> None:
    s = Setup()
    request = await parked(s)
    s.store.decide(request["id"], "approved")
    s.notes.block = asyncio.Event()  # the approved delete starts and never returns
    worker = s.worker()
    running = asyncio.create_task(worker.run_once())
    while not s.notes.deleted:  # noqa: ASYNC110 - waits for the handler to start
        await asyncio.sleep(0)
    running.cancel()  # the worker stops mid-call
    await asyncio.gather(running, return_exceptions=True)
    s.notes.block = None
    assert await s.worker(worker_id="w2").run_once() == ["succeeded"]
    assert len(s.notes.deleted) == 1  # not run a second time: its outcome is unknown
    assert s.rows()[-1][1] == "unknown"
    assert len(s.store.approvals) == 1  # and not asked twice


async def test_the_deadline_passing_while_parked_ends_the_run_without_the_call() -> None:
    s = Setup(deadline=datetime(2026, 12, 2, 9, 30, tzinfo=UTC))
    request = await parked(s)
    s.clock.now += timedelta(hours=2)  # past the deadline and the request's time to live
    assert await s.worker().run_once() == ["skipped"]
    it = s.iteration
    assert (it["status"], it["stop_reason"]) == ("failed", "deadline_passed")
    assert request["status"] == "expired" and "deadline" in request["decision_note"]
    assert s.store.missions[s.mission_id]["status"] == "completed"
    assert s.notes.deleted == []


async def test_log_only_runs_the_call_and_records_a_would_be_ask() -> None:
    s = Setup(mode="log-only")
    assert await s.worker().run_once() == ["succeeded"]
    assert [n for n, _ in s.notes.deleted] == [7]
    assert s.rows()[-1] == ("notes_delete", "ok", "approval_required")
    assert s.store.approvals == []


async def test_an_agent_may_ask_where_the_daemon_denies_and_the_other_way_round() -> None:
    asks = Setup(destructive="deny", agent_destructive="ask")
    assert await asks.worker().run_once() == ["awaiting_approval"]
    denies = Setup(destructive="ask", agent_destructive="deny")
    assert await denies.worker().run_once() == ["succeeded"]
    assert denies.rows()[-1] == ("notes_delete", "denied", "destructive_not_opted_in")
    assert denies.store.approvals == []


async def test_an_approved_call_is_journaled_before_it_runs_even_with_the_gate_turned_off() -> None:
    s = Setup()
    request = await parked(s)
    s.store.decide(request["id"], "approved")
    [agent] = s.store.agents.values()
    agent["policy_mode"] = "off"  # changed while the run was parked
    s.notes.block = asyncio.Event()
    running = asyncio.create_task(s.worker().run_once())
    while not s.notes.deleted:  # noqa: ASYNC110 - waits for the handler to start
        await asyncio.sleep(0)
    assert s.rows()[-1][:2] == ("notes_delete", "started")  # recorded before it ran
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    s.notes.block = None
    assert await s.worker(worker_id="w2").run_once() == ["succeeded"]
    assert len(s.notes.deleted) == 1
