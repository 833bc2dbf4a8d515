"""``mana-ai replay ITERATION_ID --rerun``: drive the planner loop with today's code and
settings against what an iteration recorded, and report where behaviour now differs.

Nothing live runs: the model's replies are the recorded ones, round by round (an assistant
message of the restored log per request, with its recorded usage and finish reason); tool
calls get their recorded results (a handler never runs); the summariser answers with the
recorded summaries, in order (and fails where the recorded attempt failed). What is today's:
the loop, the policy gate (mode, rules, limits, the owner's opt-ins), the agent's tools and
round limit, compaction's settings and the reminder producers.

Compared, call by call and round by round:

* the policy decision on each call (``enforce`` refusing a call the recording ran shows here)
  and each call's outcome (``ok``/``error``/``denied``);
* compactions: the round each ran before, the turns it folded, whether it failed;
* the reminders of the producers that depend on the conversation only (``policy_feedback``,
  ``retry_loop``, ``rounds_left``, ``compacted``);
* the stop reason and the rounds.

Not compared: ``deadline`` and ``token_budget`` reminders (they depend on the time of the run
and on the agent's other runs; the rerun sends the recorded ones again, so that they take
their place in the per-request limit); rate limits are counted over this iteration's own
calls at their recorded times, and a call the limit refused when recorded is refused again
(the other calls it was counted with are not kept). After the first difference the model
still answers as it did, so later differences may be its consequences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from planner import (
    Approval,
    ChatMessage,
    DestructivePolicy,
    ExecutedCall,
    LoopState,
    PlannerLoopInput,
    ToolCall,
    ToolContext,
    ToolError,
    ToolSpec,
    run_planner_loop,
)
from planner.compaction import Compactor
from planner.gate import RulePolicyGate
from planner.loop import PlannerLoopResult, ReminderRole
from planner.policy import (
    PolicyConfig,
    PolicyDecision,
    PolicyGate,
    PolicyMode,
    UserPolicySettings,
)
from reminders import ReminderComposer
from worker.admin.recorded import RecordedModel, RecordedSummariser, RerunLedger, current_call
from worker.admin.replay import (
    ReplayError,
    after_approval,
    checked_iteration,
    later_attempt_last,
    restored_log,
)
from worker.admin.rerun_compare import (
    COMPARED_PRODUCERS,
    RerunReport,
    compare_calls,
    compare_compactions,
    compare_reminders,
    reminders_by_round,
)
from worker.mcp.config import is_mcp_tool_name
from worker.queries.stored import StoredCompaction, StoredInvocation, StoredIteration
from worker.run.reminder_channel import mission_reminder_channel
from worker.run.resume import approval_of

__all__ = [
    "COMPARED_PRODUCERS",
    "RerunConfig",
    "RerunReport",
    "rerun_iteration",
]

Row = dict[str, Any]

_REPLAYED_PRODUCERS = ("deadline", "token_budget")
"""Reminder producers whose recorded texts a rerun sends again (they are not compared)."""


@dataclass(frozen=True)
class RerunConfig:
    """Today's settings a rerun runs under.

    Attributes:
        tools: the tools the agent is offered today (their handlers never run).
        max_rounds: the agent's round limit today.
        policy_mode: ``off``, ``log-only`` or ``enforce`` (the agent's, else the daemon's).
        policy_config: the gate's rules configuration (``MANA_AI_POLICY_*``).
        user_settings: the owner's opt-ins and limits today.
        user_id: the agent's owner (the calls run for this user).
        compact_max_ctx: the agent's context in tokens (0: compaction off).
        compact_threshold, compact_max_per_iteration, compact_model, summariser_max_ctx: see
            ``planner.compaction.Compactor``.
        reminders: the reminder channel is on.
        reminders_disabled: producers turned off.
        reminder_role: the role reminders are sent with.
        max_tokens_per_day: the agent's budget (for the replayed token_budget reminders).
        destructive: ``deny`` or ``ask`` for destructive calls without opt-in (the agent's,
            else the daemon's); a call the recording asked a person about gets the recorded
            decision (``planner.approvals``), one it did not ask about is asked about now (the
            rerun then stops there, ``awaiting_approval``).
    """

    tools: Sequence[ToolSpec]
    max_rounds: int
    policy_mode: PolicyMode
    policy_config: PolicyConfig
    user_settings: UserPolicySettings = field(default_factory=UserPolicySettings)
    user_id: str = "rerun"
    compact_max_ctx: int = 0
    compact_threshold: float = 0.92
    compact_max_per_iteration: int = 1
    compact_model: str | None = None
    summariser_max_ctx: int | None = None
    reminders: bool = True
    reminders_disabled: frozenset[str] = frozenset()
    reminder_role: ReminderRole = "system"
    max_tokens_per_day: int | None = None
    destructive: DestructivePolicy = DestructivePolicy.DENY

    def settings_json(self) -> Row:
        """The settings that shape the comparison, for the report."""
        return {
            "policy_mode": self.policy_mode,
            "destructive": self.destructive,
            "max_rounds": self.max_rounds,
            "tools": [t.name for t in self.tools],
            "compact_max_ctx": self.compact_max_ctx,
            "compact_threshold": self.compact_threshold,
            "compact_max_per_iteration": self.compact_max_per_iteration,
            "reminders": self.reminders,
            "reminders_disabled": sorted(self.reminders_disabled),
        }


# -- the rerun ------------------------------------------------------------------------------------


async def rerun_iteration(iteration: StoredIteration, config: RerunConfig) -> RerunReport:
    """Rerun ``iteration`` (``AdminStore.get_iteration``'s row) under ``config`` and compare.

    Raises:
        ReplayError: the iteration stored no conversation (nothing to rerun), or its log,
            archive or audit is malformed, or its archive does not fit its log.
    """
    checked_iteration(iteration)
    report = RerunReport(iteration_id=int(iteration["id"]), settings=config.settings_json())
    recording = _Recording.of(iteration)
    model = recording.model
    started = iteration.get("started_at")
    start = started if isinstance(started, datetime) else datetime.now(UTC)

    def recorded_row(call: ToolCall) -> StoredInvocation | None:
        where = model.position_of(call)
        return recording.calls.get(where) if where is not None else None

    approvals = {
        (int(a["round"] or 0), int(a["position"] or 0)): approval_of(a)
        for a in iteration.get("approvals") or []
    }
    inp = PlannerLoopInput(
        system_prompt=str(recording.head[0].get("content") or ""),
        user_prompt=str(recording.head[-1].get("content") or ""),
        prior_messages=recording.prior,
        tools=list(config.tools),
        max_rounds=config.max_rounds,
        ctx=ToolContext(user_id=config.user_id, mission_id=iteration.get("mission_id")),
        policy=_gate(config, start, recorded_row, approvals),
        reminder_channel=_channel(config, recording.reminders, start),
        compactor=_compactor(config, recording.archive),
    )
    result = await run_planner_loop(inp, llm=model, on_tool_call=_executor(recorded_row))
    _compare(report, recording, config, result)
    _compare_end(report, iteration, result)
    report.compared = {
        "calls": len(recording.calls),
        "compactions": len(recording.archive),
        "rounds": len(recording.replies),
    }
    _note_takeovers(report, iteration)
    return report


@dataclass(frozen=True)
class _Recording:
    """What a rerun reads of a stored iteration: the conversation's head (system prompt,
    earlier messages, user prompt), the model's replies, the calls' rows by ``(round,
    position)``, the compaction archive in order and the reminder audit by round."""

    head: list[Row]
    prior: list[ChatMessage]
    replies: list[Row]
    model: RecordedModel
    calls: dict[tuple[int, int], StoredInvocation]
    archive: list[StoredCompaction]
    reminders: dict[int, list[Row]]

    @classmethod
    def of(cls, iteration: StoredIteration) -> _Recording:
        """The recording of a checked ``iteration``; raises ReplayError without a head."""
        log = restored_log(iteration.get("messages") or [], iteration.get("compactions") or [])
        first = next((i for i, m in enumerate(log) if m.get("role") == "assistant"), len(log))
        head = log[:first]
        if len(head) < 2 or head[0].get("role") != "system" or head[-1].get("role") != "user":
            raise ReplayError(
                f"iteration {iteration['id']} stored no conversation to rerun (status "
                f"{iteration.get('status')}, stop reason {iteration.get('stop_reason')}): the "
                "model was never asked"
            )
        replies = [m for m in log if m.get("role") == "assistant"]
        calls = {
            (int(r["round"]), int(r.get("position") or 0)): r
            for r in sorted(iteration.get("tool_invocations") or [], key=later_attempt_last)
            if r.get("round") is not None
        }
        error = iteration.get("error") if iteration.get("stop_reason") == "llm_error" else None
        try:
            prior = [ChatMessage.from_json(m) for m in head[1:-1]]
        except ValidationError as exc:
            raise ReplayError(f"the stored conversation's head cannot be read back: {exc}") from exc
        archive = sorted(iteration.get("compactions") or [], key=lambda c: c["compaction_index"])
        return cls(
            head=head,
            prior=prior,
            replies=replies,
            model=RecordedModel(replies, error),
            calls=calls,
            archive=archive,
            reminders=reminders_by_round(iteration.get("reminders") or []),
        )


def _executor(
    recorded_row: Callable[[ToolCall], StoredInvocation | None],
) -> Callable[[ToolCall], Awaitable[Any]]:
    """The loop's tool executor: each call's recorded result (or its recorded error)."""

    async def execute(call: ToolCall) -> Any:
        row = recorded_row(call)
        if row is None:
            raise ToolError("(rerun) no recorded result: the recorded run did not run this call")
        if row.get("outcome") == "ok":
            return row.get("result")
        if row.get("outcome") == "denied":
            raise ToolError("(rerun) no recorded result: the policy gate refused this call then")
        raise ToolError(str(row.get("error") or "(rerun) recorded as failed"))

    return execute


def _channel(
    config: RerunConfig, recorded: dict[int, list[Row]], start: datetime
) -> ReminderComposer | None:
    """Today's reminder channel, the time-dependent producers replaying their recorded texts."""
    if not config.reminders:
        return None
    replayed = {name: _replayed_producer(recorded, name) for name in _REPLAYED_PRODUCERS}
    return mission_reminder_channel(
        max_tokens_per_day=config.max_tokens_per_day,
        tokens_used_24h=0,
        deadline=None,
        clock=lambda: start,
        disabled=config.reminders_disabled,
        replace=replayed,
        role=config.reminder_role,
    )


def _compactor(config: RerunConfig, archive: Sequence[StoredCompaction]) -> Compactor | None:
    """Today's compactor, its summariser answering with the recorded summaries."""
    if config.compact_max_ctx <= 0:
        return None
    return Compactor(
        llm=RecordedSummariser(archive),
        max_ctx=config.compact_max_ctx,
        model=config.compact_model,
        threshold=config.compact_threshold,
        max_per_iteration=config.compact_max_per_iteration,
        summariser_max_ctx=config.summariser_max_ctx,
    )


def _compare(
    report: RerunReport, recording: _Recording, config: RerunConfig, result: PlannerLoopResult
) -> None:
    """Compare the calls, compactions and reminders; note the tools not compared."""
    record = result.record
    compactions: list[Row] = [
        {
            "round": entry.round,
            "folded_turns": entry.compaction.folded_turns if entry.compaction else 0,
            "failed": entry.compaction is None,
        }
        for entry in record.archive
    ]
    offered = {t.name for t in config.tools}
    recorded_tools = {str(r["tool"]) for r in recording.calls.values()}
    unlisted = sorted({t for t in recorded_tools if is_mcp_tool_name(t)} - offered)
    executed = list(result.executed_calls)
    parked = record.pending_approval
    if parked is not None:  # the rerun stopped at a call it asks a person about
        waits = "waits for a person's approval"
        executed.append(
            ExecutedCall(
                parked.round, parked.call, None, waits, parked.decision, index=parked.position
            )
        )
    compare_calls(report, recording.calls, executed, config.policy_mode, skip=frozenset(unlisted))
    compare_compactions(report, recording.archive, compactions)
    compare_reminders(report, recording.reminders, [r.to_json() for r in record.reminders])
    if unlisted:
        report.notes.append(
            f"MCP servers' tools are not listed in a rerun (that would start or call the "
            f"servers): the calls of {', '.join(unlisted)} were not compared"
        )
    gone = sorted(recorded_tools - offered - set(unlisted))
    if gone:
        report.notes.append(
            f"tool(s) the recorded run called that the agent is not offered today (or that "
            f"never existed): {', '.join(gone)}"
        )


def _compare_end(
    report: RerunReport, iteration: StoredIteration, result: PlannerLoopResult
) -> None:
    """Compare the stop reason and the rounds, unless the recorded run did not finish."""
    recorded_stop = iteration.get("stop_reason")
    if recorded_stop in (None, "interrupted", "crashed", "store_failed", "awaiting_approval"):
        report.notes.append(
            f"the recorded run did not finish (status {iteration.get('status')}, stop reason "
            f"{recorded_stop}): the rerun stops where the recording ends, so its stop reason "
            "and rounds are not compared"
        )
        return
    if recorded_stop != result.stop_reason:
        report.differences.append(
            {
                "kind": "stop_reason",
                "round": None,
                "recorded": recorded_stop,
                "now": result.stop_reason
                + (f" ({result.error})" if result.error and result.failed else ""),
            }
        )
    if iteration.get("rounds") != result.rounds:
        report.differences.append(
            {
                "kind": "rounds",
                "round": None,
                "recorded": iteration.get("rounds"),
                "now": result.rounds,
            }
        )


def _note_takeovers(report: RerunReport, iteration: StoredIteration) -> None:
    """Note that the recorded run went on after an approval or a takeover."""
    takeovers = (iteration.get("attempts") or [])[1:]
    if takeovers and all(after_approval(a) for a in takeovers):
        report.notes.append(
            "the recorded run waited for an approval and went on after the decision; the rerun "
            "takes the recorded decision and runs in one go (a compaction right after it went "
            "on may fall on another round)"
        )
    elif takeovers:
        report.notes.append(
            "the recorded run was taken over by another worker; the rerun runs it in one go "
            "(a compaction right after the takeover may fall on another round, and a retry_loop "
            "reminder the takeover could not see coming may now be sent)"
        )


def _gate(
    config: RerunConfig,
    start: datetime,
    recorded_row: Callable[[ToolCall], StoredInvocation | None],
    approvals: Mapping[tuple[int, int], Approval],
) -> PolicyGate | None:
    """Today's gate over the recorded calls: their recorded rate-limit slots, and for a call
    the recording asked a person about, the recorded decision on its context."""
    if config.policy_mode == "off":
        return None
    inner = RulePolicyGate(
        mode=config.policy_mode,
        config=config.policy_config,
        user_settings=config.user_settings,
        ledger=RerunLedger(start),
        consumer="mission",
        destructive=config.destructive,
    )

    async def gate(spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        current_call.set(recorded_row(call))
        if ctx.round is not None and ctx.position is not None:
            recorded = approvals.get((ctx.round, ctx.position))
            if recorded is not None:
                ctx = dataclasses.replace(ctx, approval=recorded)
        return await inner(spec, call, ctx)

    return gate


def _replayed_producer(recorded: dict[int, list[Row]], name: str) -> Any:
    """A reminder producer that sends the recorded ``name`` reminder of each round again."""

    def produce(state: LoopState) -> str | None:
        texts = [str(r["text"]) for r in recorded.get(state.round, []) if r["producer"] == name]
        return texts[0] if texts else None

    return produce
