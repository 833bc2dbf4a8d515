"""Approvals in the planner: the gate's third answer (``ask``), a round parked at the call it
asks about, and a resumed run that goes on with a person's decision: the approved call runs
once, a denied or expired one is answered with who decided and a reminder, and only the
reviewed call passes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from planner import (
    Approval,
    ApprovalDecided,
    ApprovalRequested,
    ApprovalStatus,
    CallStarted,
    ChatMessage,
    Checkpoint,
    DestructivePolicy,
    PlannerLoopInput,
    PolicyInput,
    PolicyMode,
    RunStopped,
    StopReason,
    ToolCall,
    ToolContext,
    ToolSpec,
    arguments_hash,
    evaluate_policy,
    run_planner_loop,
)
from planner.gate import RulePolicyGate
from planner.policy import PolicyConfig, UserPolicySettings
from planner.testing import (
    InMemoryCallLedger,
    RecordingSink,
    ScriptedChatModel,
    final_answer,
    tool_calls,
)
from reminders import policy_feedback_reminder


class Files:
    """``look`` (read), ``touch`` (write) and ``wipe`` (destructive), recording what ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict[str, Any], ToolContext]] = []

    def spec(self, name: str, hint: Any) -> ToolSpec:
        async def handler(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            self.ran.append((name, args, ctx))
            return {"done": name, **args}

        schema = {"type": "object", "properties": {"path": {"type": "string"}}}
        return ToolSpec(name, f"{name} a file", schema, hint, handler, scope="files")

    def specs(self) -> list[ToolSpec]:
        return [
            self.spec("look", "read"),
            self.spec("touch", "write"),
            self.spec("wipe", "destructive"),
        ]

    def names(self) -> list[str]:
        return [name for name, _, _ in self.ran]


def gate(
    mode: str = "enforce", destructive: str = "ask", opted_in: frozenset[str] = frozenset()
) -> RulePolicyGate:
    return RulePolicyGate(
        mode=PolicyMode(mode),
        config=PolicyConfig(),
        user_settings=UserPolicySettings(destructive_opt_ins=opted_in),
        ledger=InMemoryCallLedger(),
        destructive=DestructivePolicy(destructive),
    )


def inp(files: Files, policy: Any, **kw: Any) -> PlannerLoopInput:
    return PlannerLoopInput(
        system_prompt="Be careful.",
        user_prompt="Tidy up.",
        tools=files.specs(),
        ctx=ToolContext(user_id="u1", iteration_id=7),
        policy=policy,
        **kw,
    )


def approval(status: str, *, path: str = "/tmp/x", tool: str = "wipe", **kw: Any) -> Approval:
    return Approval(
        request_id=12,
        status=ApprovalStatus(status),
        tool=tool,
        arguments_hash=arguments_hash({"path": path}),
        decided_by=kw.get("by", "alice"),
        reason=kw.get("reason"),
        decided_at=datetime(2026, 12, 2, tzinfo=UTC),
    )


# -- the rule ----------------------------------------------------------------------------------


def _decide(
    mode: str, destructive: str, *, hint: str = "destructive", approved: Approval | None = None
) -> Any:
    files = Files()
    spec = files.spec("wipe", hint)
    return evaluate_policy(
        PolicyInput(
            spec,
            ToolContext(user_id="u1"),
            {"path": "/tmp/x"},
            UserPolicySettings(),
            None,
            PolicyMode(mode),
            destructive=DestructivePolicy(destructive),
            approval=approved,
        )
    )


@pytest.mark.parametrize(
    ("mode", "destructive", "hint", "verdict", "reason", "allow"),
    [
        ("enforce", "deny", "destructive", "deny", "destructive_not_opted_in", False),
        ("enforce", "ask", "destructive", "ask", "approval_required", False),
        ("log-only", "ask", "destructive", "ask", "approval_required", True),
        ("log-only", "deny", "destructive", "deny", "destructive_not_opted_in", True),
        ("enforce", "ask", "write", "allow", "allowed", True),
        ("off", "ask", "destructive", "allow", "policy_off", True),
    ],
)
def test_the_gate_asks_only_for_destructive_calls_without_opt_in(
    mode: str, destructive: str, hint: str, verdict: str, reason: str, allow: bool
) -> None:
    decision = _decide(mode, destructive, hint=hint)
    assert (decision.verdict, decision.reason, decision.allow) == (verdict, reason, allow)
    assert decision.parks == (verdict == "ask" and mode == "enforce")
    if verdict == "ask":
        assert decision.reminder is None  # the model is not told anything: it waits


def test_a_granted_approval_of_exactly_this_call_passes_the_opt_in_rule() -> None:
    decision = _decide("enforce", "ask", approved=approval("approved", reason="ok"))
    assert (decision.allow, decision.verdict, decision.reason) == (True, "allow", "approved")
    assert decision.message == "wipe was approved by alice (approval 12): ok"


@pytest.mark.parametrize(
    "other",
    [approval("approved", path="/etc"), approval("approved", tool="zap")],
    ids=["other arguments", "another tool"],
)
def test_an_approval_of_another_call_lets_nothing_run(other: Approval) -> None:
    decision = _decide("enforce", "ask", approved=other)
    assert (decision.allow, decision.reason) == (False, "approval_mismatch")
    assert decision.reminder and "not the call that was approved" in decision.reminder


@pytest.mark.parametrize("status", ["denied", "expired"])
def test_a_refused_approval_refuses_the_call(status: str) -> None:
    decision = _decide("enforce", "deny", approved=approval(status, reason="too risky"))
    assert (decision.allow, decision.reason) == (False, f"approval_{status}")


def test_arguments_hash_ignores_key_order_but_not_values() -> None:
    assert arguments_hash({"a": 1, "b": "é"}) == arguments_hash({"b": "é", "a": 1})
    assert arguments_hash({"a": 1}) != arguments_hash({"a": 2})
    assert len(arguments_hash({})) == 64


# -- parking -----------------------------------------------------------------------------------


async def test_a_round_parks_at_the_call_the_gate_asks_about() -> None:
    files = Files()
    sink = RecordingSink()
    llm = ScriptedChatModel(
        [
            tool_calls(
                ("look", {"path": "/a"}),
                ("wipe", {"path": "/tmp/x"}),
                ("touch", {"path": "/b"}),
                text="Cleaning up /tmp/x now.",
            )
        ]
    )
    result = await run_planner_loop(inp(files, gate()), llm=llm, sink=sink)
    assert result.stop_reason == StopReason.AWAITING_APPROVAL and not result.failed
    assert files.names() == ["look"]  # the call before it ran; the ask and the one after wait
    assert [c.call.name for c in result.executed_calls] == ["look"]
    assert result.messages[-1].role == "assistant"  # the log stops at the reply that asked
    parked = result.record.pending_approval
    assert parked is not None
    assert (parked.round, parked.position, parked.call.name) == (1, 1, "wipe")
    assert parked.decision.reason == "approval_required"
    assert parked.reply_text == "Cleaning up /tmp/x now."
    kinds = [type(e).__name__ for e in sink.events]
    assert "ApprovalRequested" in kinds and "RoundEnded" not in kinds
    assert not any(isinstance(e, CallStarted) and e.call.name != "look" for e in sink.events)
    assert isinstance(sink.events[-1], RunStopped)


async def test_log_only_records_a_would_be_ask_and_runs_the_call() -> None:
    files = Files()
    llm = ScriptedChatModel([tool_calls(("wipe", {"path": "/tmp/x"})), final_answer("done")])
    result = await run_planner_loop(inp(files, gate(mode="log-only")), llm=llm)
    assert result.stop_reason == "final_answer"
    assert files.names() == ["wipe"]
    [call] = result.executed_calls
    assert call.decision is not None and call.decision.verdict == "ask" and call.decision.allow


async def test_a_consumer_that_cannot_wait_gets_the_ask_as_a_refusal() -> None:
    from planner import ToolRegistry, execute_calls

    files = Files()
    [executed] = await execute_calls(
        [ToolCall(id="c1", name="wipe", arguments={"path": "/tmp/x"})],
        round=1,
        registry=ToolRegistry(files.specs()),
        ctx=ToolContext(user_id="u1"),
        policy=gate(),
    )
    assert files.names() == []
    assert executed.error is not None and executed.error.startswith("not run: it needs a person")


# -- resuming with a decision --------------------------------------------------------------------


def parked_checkpoint(approvals: dict[int, Approval]) -> Checkpoint:
    """What a run parked at ``wipe`` (position 1 of round 1) left, ``look`` (0) done."""
    from planner import ExecutedCall

    calls = (
        ToolCall(id="c0", name="look", arguments={"path": "/a"}),
        ToolCall(id="c1", name="wipe", arguments={"path": "/tmp/x"}),
        ToolCall(id="c2", name="touch", arguments={"path": "/b"}),
    )
    messages = [
        ChatMessage(role="system", content="Be careful."),
        ChatMessage(role="user", content="Tidy up."),
        ChatMessage(role="assistant", content="Cleaning up.", tool_calls=calls),
    ]
    look = ExecutedCall(1, calls[0], {"done": "look"}, None, index=0, ran=True)
    return Checkpoint(messages=messages, rounds_done=1, settled={0: look}, approvals=approvals)


async def test_an_approved_call_runs_once_with_the_reviewed_arguments_and_the_run_goes_on() -> None:
    files = Files()
    sink = RecordingSink()
    llm = ScriptedChatModel([final_answer("Tidied.")])
    checkpoint = parked_checkpoint({1: approval("approved", reason="fine")})
    result = await run_planner_loop(inp(files, gate(), resume=checkpoint), llm=llm, sink=sink)
    assert result.stop_reason == "final_answer"
    assert files.names() == ["wipe", "touch"]  # look ran before the park: not again
    _, args, ctx = files.ran[0]
    assert args == {"path": "/tmp/x"}
    assert ctx.approval is not None and ctx.approval.decided_by == "alice"
    wipe = result.executed_calls[1]
    assert wipe.decision is not None and wipe.decision.reason == "approved"
    decided = [e for e in sink.events if isinstance(e, ApprovalDecided)]
    assert [(e.position, e.approval.status) for e in decided] == [(1, "approved")]


@pytest.mark.parametrize(
    ("status", "words"),
    [("denied", "denied by bob (approval 12): not today"), ("expired", "expired unanswered")],
)
async def test_a_denied_or_expired_call_is_answered_with_who_decided_and_a_reminder(
    status: str, words: str
) -> None:
    files = Files()
    requests: list[Any] = []

    def model(request: Any) -> Any:
        requests.append(request)
        return final_answer("Left /tmp/x alone.")

    from planner.testing import FunctionChatModel

    checkpoint = parked_checkpoint({1: approval(status, by="bob", reason="not today")})
    channel = policy_feedback_reminder_channel()
    result = await run_planner_loop(
        inp(files, gate(), resume=checkpoint, reminder_channel=channel),
        llm=FunctionChatModel(model),
    )
    assert result.stop_reason == "final_answer"
    assert files.names() == ["touch"]  # the call after it still runs; wipe never does
    wipe = result.executed_calls[1]
    assert wipe.error is not None and words in wipe.error and not wipe.ran
    assert wipe.decision is not None and wipe.decision.reason == f"approval_{status}"
    [request] = requests
    tool_texts = [m.content or "" for m in request.messages if m.role == "tool"]
    assert any(words in t for t in tool_texts)  # the model reads who decided
    reminders = [m.content or "" for m in request.messages if m.role == "system"][1:]
    assert any("do not call it again" in r for r in reminders)


def policy_feedback_reminder_channel() -> Any:
    return lambda state: [t for t in [policy_feedback_reminder(state)] if t]


async def test_an_approved_call_whose_tool_is_gone_is_not_run_and_says_why() -> None:
    files = Files()
    llm = ScriptedChatModel([final_answer("ok")])
    checkpoint = parked_checkpoint({1: approval("approved")})
    tools = [t for t in files.specs() if t.name != "wipe"]
    loop_inp = PlannerLoopInput(
        system_prompt="s",
        user_prompt="u",
        tools=tools,
        ctx=ToolContext(user_id="u1", iteration_id=7),
        policy=gate(),
        resume=checkpoint,
    )
    result = await run_planner_loop(loop_inp, llm=llm)
    wipe = result.executed_calls[1]
    assert wipe.decision is not None and wipe.decision.reason == "tool_not_offered"
    assert wipe.error is not None and "no longer offers wipe" in wipe.error
    assert files.names() == ["touch"]


async def test_a_resumed_run_whose_approval_is_still_pending_parks_again_without_running() -> None:
    files = Files()
    checkpoint = parked_checkpoint({1: approval("pending")})
    result = await run_planner_loop(
        inp(files, gate(), resume=checkpoint), llm=ScriptedChatModel([], unused_ok=True)
    )
    assert result.stop_reason == StopReason.AWAITING_APPROVAL
    assert files.names() == []
    parked = result.record.pending_approval
    assert isinstance(parked, ApprovalRequested) and parked.position == 1
