"""The runner, the tick, the journal, the gate and resume on the in-memory store: the mission
logic with no database (``worker.store.memory.InMemoryMissionStore``, the twin of the PostgreSQL
store), a scripted model and in-memory tools. The SQL itself is the integration tier's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from planner import CompletionRequest, CompletionResponse, ToolContext, ToolSpec
from planner.policy import PolicyConfig, RateLimit
from planner.testing import FunctionChatModel, ScriptedChatModel, final_answer, tool_calls
from worker.daemon.worker import Worker
from worker.policy_setup import PolicySetup
from worker.run.runner import MissionRunner
from worker.store.memory import InMemoryMissionStore

LEASE = timedelta(seconds=30)


class Notebook:
    """In-memory tools: ``look`` (read) and ``save`` (a write, idempotent per key: at most
    one entry per idempotency key), and what the store held when ``save`` ran."""

    def __init__(self, store: InMemoryMissionStore) -> None:
        self.store = store
        self.saved: dict[str, str] = {}
        self.started_rows_seen: list[int] = []
        self.fail_with: BaseException | None = None

    async def look(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"saved": sorted(self.saved.values())}

    async def save(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        assert ctx.iteration_id is not None and ctx.idempotency_key is not None
        started = [
            r for r in self.store.invocations_of(ctx.iteration_id) if r["outcome"] == "started"
        ]
        self.started_rows_seen.append(len(started))
        if self.fail_with is not None:
            raise self.fail_with
        key = ctx.idempotency_key
        self.saved.setdefault(key, str(args.get("text", "")))
        return {"key": key}

    def specs(self, *, idempotent: bool = True) -> list[ToolSpec]:
        return [
            ToolSpec("look", "Look.", {"type": "object"}, "read", self.look),
            ToolSpec(
                "save", "Save.", {"type": "object"}, "write", self.save, idempotent=idempotent
            ),
        ]


def setup(
    *,
    cron: str | None = None,
    policy: str | None = None,
    rate_limit: int = 30,
    lease: timedelta = LEASE,
    idempotent: bool = True,
    **agent: Any,
) -> tuple[InMemoryMissionStore, Notebook, int, Any]:
    store = InMemoryMissionStore()
    notebook = Notebook(store)
    agent_id = store.add_agent("a1", **agent)
    mission_id = store.add_mission(agent_id, cron=cron, objective="Save it.")

    def worker(llm: Any, *, worker_id: str = "w1", tools: list[ToolSpec] | None = None) -> Worker:
        gate = None
        if policy is not None:
            gate = PolicySetup(
                default_mode=policy,  # type: ignore[arg-type]
                config=PolicyConfig(rate_limit=RateLimit(rate_limit, timedelta(seconds=60))),
                ledger=store,
            )
        offered = tools or notebook.specs(idempotent=idempotent)
        runner = MissionRunner(
            store=store,
            llm=llm,
            tools_for=lambda m: offered,
            worker_id=worker_id,
            lease=lease,
            policy=gate,
        )
        return Worker(
            store=store, runner=runner, worker_id=worker_id, max_concurrent_missions=4, lease=lease
        )

    return store, notebook, mission_id, worker


def results_of(request: CompletionRequest) -> list[str]:
    return [m.content or "" for m in request.messages if m.role == "tool"]


def save_then_answer(request: CompletionRequest) -> CompletionResponse:
    if results_of(request):
        return final_answer("Saved.")
    return tool_calls(("save", {"text": "x"}))


async def test_a_one_shot_mission_runs_once_and_is_completed_with_its_log() -> None:
    store, notebook, mission_id, worker = setup()
    llm = ScriptedChatModel([tool_calls(("look", {}), ("save", {"text": "x"})), final_answer("ok")])
    assert await worker(llm).run_once() == ["succeeded"]
    llm.assert_exhausted()
    [it] = store.iterations.values()
    assert (it["status"], it["stop_reason"], it["rounds"]) == ("succeeded", "final_answer", 2)
    roles = [m["role"] for m in it["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [(r["tool"], r["outcome"], r["position"]) for r in store.invocations] == [
        ("look", "ok", 0),
        ("save", "ok", 1),
    ]
    mission = store.missions[mission_id]
    assert (mission["status"], mission["lease_owner"]) == ("completed", None)
    assert list(notebook.saved) == [f"{it['id']}:1:1"]  # the key: iteration, round, position


async def test_a_cron_mission_gets_its_next_run_and_stays_active() -> None:
    store, _, mission_id, worker = setup(cron="0 * * * *")
    assert await worker(FunctionChatModel(save_then_answer)).run_once() == ["succeeded"]
    mission = store.missions[mission_id]
    assert mission["status"] == "active" and mission["next_run_at"] > datetime.now(UTC)


async def test_a_write_is_journaled_before_its_handler_runs_in_one_step() -> None:
    store, notebook, _, worker = setup()
    assert await worker(FunctionChatModel(save_then_answer)).run_once() == ["succeeded"]
    assert notebook.started_rows_seen == [1]  # its started row was there when it ran
    # one step to start the write, one to commit its round (with its outcome), one to finish
    assert store.calls == {
        "claim_due": 1,
        "record_call_start": 1,
        "commit_round": 1,
        "end_run": 1,
    }


async def test_a_blip_while_the_run_is_stored_is_retried_and_nothing_is_lost() -> None:
    store, notebook, mission_id, worker = setup()
    store.fail_next(ConnectionResetError("reset"), times=3, methods={"end_run"})
    assert await worker(FunctionChatModel(save_then_answer)).run_once() == ["succeeded"]
    [it] = store.iterations.values()
    assert (it["status"], len(it["messages"])) == ("succeeded", 5)
    assert store.calls["end_run"] == 4 and len(notebook.saved) == 1
    assert store.missions[mission_id]["status"] == "completed"


async def test_data_the_store_refuses_is_stored_as_a_failure_with_its_log() -> None:
    store, _, mission_id, worker = setup()
    store.fail_next(ValueError("value out of range"), methods={"end_run"})
    assert await worker(FunctionChatModel(save_then_answer)).run_once() == ["failed"]
    [it] = store.iterations.values()
    assert (it["status"], it["stop_reason"]) == ("failed", "store_failed")
    assert "value out of range" in it["error"] and len(it["messages"]) == 5
    assert store.missions[mission_id]["status"] == "completed"  # never run again


async def test_a_journal_unreachable_past_the_lease_interrupts_and_the_next_claim_resumes() -> None:
    store, notebook, _, worker = setup(lease=timedelta(seconds=0.3))
    store.fail_next(OSError("connection refused"), times=1000, methods={"record_call_start"})
    seen: list[list[str]] = []

    def model(request: CompletionRequest) -> CompletionResponse:
        seen.append(results_of(request))
        return save_then_answer(request)

    assert await worker(FunctionChatModel(model)).run_once() == ["interrupted"]
    assert notebook.saved == {}  # the write never ran unrecorded
    [it] = store.iterations.values()
    assert (it["status"], it["stop_reason"]) == ("failed", "interrupted")
    assert "did not answer" in it["error"]
    store.clear_faults()  # the database is back
    assert await worker(FunctionChatModel(model)).run_once() == ["succeeded"]
    assert len(notebook.saved) == 1 and store.iterations[it["id"]]["attempt"] == 2
    assert not any("try again" in r for results in seen for r in results)


async def test_a_write_whose_own_store_fails_is_made_again_by_the_resume() -> None:
    from planner import RunInterrupted

    store, notebook, _, worker = setup()
    notebook.fail_with = RunInterrupted("save: its database did not answer")
    seen: list[list[str]] = []

    def model(request: CompletionRequest) -> CompletionResponse:
        seen.append(results_of(request))
        return save_then_answer(request)

    assert await worker(FunctionChatModel(model)).run_once() == ["interrupted"]
    notebook.fail_with = None
    assert await worker(FunctionChatModel(model)).run_once() == ["succeeded"]
    [it] = store.iterations.values()
    assert (it["status"], it["attempt"], it["rounds"]) == ("succeeded", 2, 2)
    assert len(notebook.saved) == 1 and seen[-1] and '"key"' in seen[-1][0]
    [row] = store.invocations
    assert (row["outcome"], row["attempt"]) == ("ok", 1)  # the same row, brought up to date


async def test_a_write_that_is_not_idempotent_is_reported_on_resume_not_made_again() -> None:
    from planner import RunInterrupted

    store, notebook, _, worker = setup(idempotent=False)
    notebook.fail_with = RunInterrupted("save: its database did not answer")
    assert await worker(FunctionChatModel(save_then_answer)).run_once() == ["interrupted"]
    notebook.fail_with = None
    told: list[list[str]] = []

    def model(request: CompletionRequest) -> CompletionResponse:
        told.append(results_of(request))
        return final_answer("Checked.")

    assert await worker(FunctionChatModel(model)).run_once() == ["succeeded"]
    assert notebook.saved == {} and "its outcome is unknown" in told[0][0]
    [row] = store.invocations
    assert row["outcome"] == "unknown"


async def test_a_takeover_resumes_after_the_last_checkpoint() -> None:
    store, notebook, mission_id, worker = setup(lease=timedelta(seconds=30))
    waiting = asyncio.Event()

    async def victim(request: CompletionRequest) -> CompletionResponse:
        if not results_of(request):
            return tool_calls(("save", {"text": "x"}))
        waiting.set()
        await asyncio.Event().wait()  # the worker "dies" while round 2 waits for the model
        raise AssertionError("unreachable")

    [task] = await worker(FunctionChatModel(victim), worker_id="victim").tick()
    await waiting.wait()
    store.missions[mission_id]["lease_expires_at"] = datetime.now(UTC) - timedelta(seconds=1)
    heir = ScriptedChatModel([final_answer("Saved.")])
    try:
        assert await worker(heir, worker_id="heir").run_once() == ["succeeded"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    heir.assert_exhausted()
    [it] = store.iterations.values()
    assert (it["attempt"], it["rounds"], it["worker_id"]) == (2, 2, "heir")
    [request] = heir.requests
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool"]
    assert len(notebook.saved) == 1  # the write of round 1 was not made again


async def test_a_daily_budget_used_up_skips_the_run_without_asking_the_model() -> None:
    store, _, mission_id, worker = setup(max_tokens_per_day=10, cron="0 * * * *")
    other = store.add_mission(store.missions[mission_id]["agent_id"])
    llm = ScriptedChatModel([final_answer("one"), final_answer("two")])
    first = await worker(llm).run_once()  # both due: the first run spends the budget
    assert sorted(first) == ["succeeded", "succeeded"]
    store.missions[mission_id]["next_run_at"] = datetime.now(UTC)
    assert await worker(ScriptedChatModel([])).run_once() == ["failed"]
    failed = [it for it in store.iterations.values() if it["status"] == "failed"]
    assert [it["stop_reason"] for it in failed] == ["budget_exhausted"]
    assert other in store.missions


async def test_a_paused_mission_stays_paused_when_its_run_ends() -> None:
    store, _, mission_id, worker = setup(cron="0 * * * *")

    def pause_then_answer(request: CompletionRequest) -> CompletionResponse:
        store.missions[mission_id]["status"] = "paused"  # an admin pauses it meanwhile
        return final_answer("done")

    assert await worker(FunctionChatModel(pause_then_answer)).run_once() == ["succeeded"]
    assert store.missions[mission_id]["status"] == "paused"


async def test_a_past_deadline_completes_the_mission_without_a_run() -> None:
    store, _, mission_id, worker = setup(cron="0 * * * *")
    store.missions[mission_id]["deadline"] = datetime.now(UTC) - timedelta(hours=1)
    assert await worker(ScriptedChatModel([])).run_once() == ["skipped"]
    assert store.missions[mission_id]["status"] == "completed" and store.iterations == {}


@pytest.mark.parametrize(
    ("mode", "saved", "outcomes"), [("enforce", 1, "ok denied"), ("log-only", 2, "ok ok")]
)
async def test_the_gate_counts_a_write_with_its_start(mode: str, saved: int, outcomes: str) -> None:
    store, notebook, _, worker = setup(policy=mode, rate_limit=1)
    llm = ScriptedChatModel(
        [tool_calls(("save", {"text": "a"}), ("save", {"text": "b"})), final_answer("ok")]
    )
    assert await worker(llm).run_once() == ["succeeded"]
    assert len(notebook.saved) == saved
    assert " ".join(r["outcome"] for r in store.invocations) == outcomes
    assert [r["policy_decision"]["verdict"] for r in store.invocations] == ["allow", "deny"]
    # each reservation went with its start: no ledger call of its own
    assert "reserve" not in store.calls and store.calls["record_call_start"] == 2


async def test_an_unreachable_ledger_interrupts_an_enforced_run_untold() -> None:
    store, _, _, worker = setup(policy="enforce", lease=timedelta(seconds=0.3))
    store.fail_next(OSError("connection refused"), times=1000, methods={"reserve"})
    llm = ScriptedChatModel([tool_calls(("look", {}))])
    assert await worker(llm).run_once() == ["interrupted"]
    llm.assert_exhausted()
    [it] = store.iterations.values()
    assert "rate-limit ledger did not answer for look" in it["error"]
    assert store.invocations == []


async def test_a_lease_lost_to_another_worker_stores_nothing() -> None:
    store, _, mission_id, worker = setup()

    def thief(request: CompletionRequest) -> CompletionResponse:
        store.missions[mission_id]["lease_owner"] = "thief"  # another worker took it over
        return final_answer("mine")

    assert await worker(FunctionChatModel(thief)).run_once() == ["lease_lost"]
    [it] = store.iterations.values()
    assert it["status"] == "running" and it["messages"] == []


async def test_a_stored_run_reruns_with_no_difference_and_shows_what_today_changes() -> None:
    from worker.admin.rerun import RerunConfig, rerun_iteration

    store, notebook, _, worker = setup(policy="log-only")
    llm = ScriptedChatModel([tool_calls(("look", {}), ("save", {"text": "x"})), final_answer("ok")])
    assert await worker(llm).run_once() == ["succeeded"]
    [iteration_id] = store.iterations
    stored = store.get_iteration(iteration_id)
    same = RerunConfig(
        tools=notebook.specs(),
        max_rounds=5,
        policy_mode="log-only",
        policy_config=PolicyConfig(),
        user_id="u1",
    )
    assert (await rerun_iteration(stored, same)).differences == []
    fewer = RerunConfig(
        tools=notebook.specs(), max_rounds=1, policy_mode="log-only", policy_config=PolicyConfig()
    )
    kinds = {d["kind"] for d in (await rerun_iteration(stored, fewer)).differences}
    assert "stop_reason" in kinds
