"""What a resumed run knows about the round under way before it goes on: the calls settled
already, people's decisions on the calls the gate asked about, and the standing approvals
that go with the round's calls (``planner.loop`` resumes from a ``Checkpoint``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.approvals import Approval
from planner.calls import ExecutedCall, denial_text
from planner.events import ApprovalDecided, Checkpoint, RunSink
from planner.messages import ToolCall
from planner.policy import DecisionReason, PolicyDecision, PolicyMode, PolicyVerdict
from planner.tools import ToolRegistry

__all__ = ["decided_calls", "standing_for"]


async def decided_calls(
    resume: Checkpoint,
    calls: Sequence[ToolCall],
    registry: ToolRegistry,
    emit: RunSink,
) -> tuple[dict[int, ExecutedCall], dict[int, Approval]]:
    """The pending round's results known before it goes on (``resume.settled``, plus the
    refusals of the calls a person denied or nobody approved in time, and of approved calls
    whose tool is no longer offered), and the granted approvals of the calls that run now,
    both by 0-based position; reports every decision found (``ApprovalDecided``)."""
    settled = dict(resume.settled)
    approved: dict[int, Approval] = {}
    round_no = resume.rounds_done
    for position, approval in sorted(resume.approvals.items()):
        if position in settled or not 0 <= position < len(calls) or not approval.decided:
            continue  # already settled (it ran), or still pending: the gate asks again
        call = calls[position]
        await emit(ApprovalDecided(round_no, position, call, approval))
        if approval.granted and call.name in registry:
            approved[position] = approval
            continue
        settled[position] = _refused(round_no, position, call, approval)
    return settled, approved


def _refused(round_no: int, position: int, call: ToolCall, approval: Approval) -> ExecutedCall:
    """The result of a call a person denied, nobody approved in time, or that was approved
    but whose tool is no longer offered."""
    reason: str
    if approval.granted:
        reason, message, reminder = (
            DecisionReason.TOOL_NOT_OFFERED,
            f"{call.name} was {approval.describe()}, but this agent no longer offers "
            f"{call.name}; it was not run",
            f"{call.name} is no longer available; do not call it again.",
        )
    else:
        reason, message, reminder = approval.refusal()
    decision = PolicyDecision(
        allow=False,
        reason=reason,
        verdict=PolicyVerdict.DENY,
        mode=PolicyMode.ENFORCE,
        message=message,
        reminder=reminder,
    )
    error = message if approval.granted else denial_text(decision)
    return ExecutedCall(round_no, call, None, error, decision, index=position)


def standing_for(
    calls: Sequence[ToolCall],
    standing: Sequence[Approval],
    settled: Mapping[int, ExecutedCall] | None,
) -> dict[int, Approval]:
    """The standing approvals that go with ``calls``, by position: each to the first call not
    settled already whose tool and arguments it was given for (``Approval.matches``), at most
    once."""
    given: dict[int, Approval] = {}
    left = list(standing)
    for position, call in enumerate(calls):
        if settled and position in settled:
            continue
        match = next((a for a in left if a.matches(call)), None)
        if match is not None:
            given[position] = match
            left.remove(match)
    return given
