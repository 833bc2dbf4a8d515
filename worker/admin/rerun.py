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
import json
from collections.abc import Callable, Mapping, Sequence
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
from planner.loop import ReminderRole
from planner.policy import (
    PolicyConfig,
    PolicyDecision,
    PolicyGate,
    PolicyMode,
    UserPolicySettings,
)
from worker.admin.recorded import RecordedModel, RecordedSummariser, RerunLedger, current_call
from worker.admin.replay import (
    ReplayError,
    after_approval,
    checked_iteration,
    later_attempt_last,
    policy_text,
    restored_log,
)
from worker.mcp.config import is_mcp_tool_name
from worker.queries.stored import StoredCompaction, StoredInvocation, StoredIteration
from worker.run.reminder_channel import mission_reminder_channel
from worker.run.resume import approval_of
from worker.store.rows import call_outcome
from worker.terminal_text import visible_line

__all__ = [
    "COMPARED_PRODUCERS",
    "RerunConfig",
    "RerunReport",
    "rerun_iteration",
]

Row = dict[str, Any]

COMPARED_PRODUCERS = ("policy_feedback", "retry_loop", "rounds_left", "compacted")
"""Reminder producers whose texts depend on the conversation only, hence compared."""

_REPLAYED_PRODUCERS = ("deadline", "token_budget")

NOT_COMPARED = (
    "deadline and token_budget reminders: they depend on the time of the run and on the "
    "agent's other runs (the recorded ones are sent again)",
    "rate limits: counted over this iteration's own calls at their recorded times; a call the "
    "limit refused when recorded is refused again (the calls it was counted with are not kept)",
    "tool results and model replies: the recorded ones are replayed",
)


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


@dataclass
class RerunReport:
    """What a rerun found.

    Attributes:
        iteration_id: the iteration rerun.
        settings: ``RerunConfig.settings_json()``.
        differences: each ``{"kind", "round", "recorded", "now", ...}``; kinds: ``policy``,
            ``outcome``, ``compaction``, ``reminders``, ``stop_reason``, ``rounds``.
        compared: what was compared (counts), for the "no difference" line.
        not_compared: what a rerun cannot compare, and why.
        notes: caveats for this iteration (a resumed run, tools offered no longer).
    """

    iteration_id: int
    settings: Row
    differences: list[Row] = field(default_factory=list)
    compared: Row = field(default_factory=dict)
    not_compared: tuple[str, ...] = NOT_COMPARED
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> Row:
        """The report as JSON-ready data."""
        return {
            "iteration_id": self.iteration_id,
            "settings": self.settings,
            "differences": self.differences,
            "compared": self.compared,
            "not_compared": list(self.not_compared),
            "notes": self.notes,
        }

    def lines(self) -> list[str]:
        """The report for people: one line per fact (what came from a model or a tool has
        its newlines and hidden characters escaped)."""
        c = self.compared
        what = (
            f"{c.get('calls', 0)} policy decision(s) and outcome(s), "
            f"{c.get('compactions', 0)} compaction(s), the reminders of {c.get('rounds', 0)} "
            f"round(s), the stop reason"
        )
        settings = self.settings
        out = [
            f"rerun of iteration {self.iteration_id} with today's code and settings "
            f"(policy mode {settings['policy_mode']}, max rounds {settings['max_rounds']}, "
            f"compact max ctx {settings['compact_max_ctx']}, reminders "
            f"{'on' if settings['reminders'] else 'off'}) against its recorded replies and "
            "tool results"
        ]
        if not self.differences:
            out.append(f"no difference: compared {what}.")
        else:
            out.append(f"{len(self.differences)} difference(s) (compared {what}):")
            out.extend(f"  {_difference_text(d)}" for d in self.differences)
        out.extend(f"note: {n}" for n in self.notes)
        out.append("not compared: " + "; ".join(self.not_compared) + ".")
        # tool names, errors and reminders came from models and tools: one line each, shown
        return [visible_line(line) for line in out]


def _difference_text(d: Row) -> str:
    where = f"round {d['round']}: " if d.get("round") is not None else ""
    kind = d["kind"]
    if kind in ("policy", "outcome"):
        call = f"{d['tool']} (call {d['call_id']})"
        if kind == "policy":
            return f"{where}{call}: policy recorded {d['recorded']}, now {d['now']}"
        return f"{where}{call}: outcome recorded {d['recorded']}, now {d['now']}"
    if kind == "reminders":
        return f"{where}reminders recorded {d['recorded']}, now {d['now']}"
    if kind == "compaction":
        return f"compaction recorded {d['recorded']}, now {d['now']}"
    return f"{kind} recorded {d['recorded']}, now {d['now']}"


# -- the rerun ------------------------------------------------------------------------------------


async def rerun_iteration(iteration: StoredIteration, config: RerunConfig) -> RerunReport:
    """Rerun ``iteration`` (``AdminStore.get_iteration``'s row) under ``config`` and compare.

    Raises:
        ReplayError: the iteration stored no conversation (nothing to rerun), or its log,
            archive or audit is malformed, or its archive does not fit its log.
    """
    checked_iteration(iteration)
    report = RerunReport(iteration_id=int(iteration["id"]), settings=config.settings_json())
    log = restored_log(iteration.get("messages") or [], iteration.get("compactions") or [])
    first_reply = next((i for i, m in enumerate(log) if m.get("role") == "assistant"), len(log))
    head = log[:first_reply]
    if len(head) < 2 or head[0].get("role") != "system" or head[-1].get("role") != "user":
        raise ReplayError(
            f"iteration {iteration['id']} stored no conversation to rerun (status "
            f"{iteration.get('status')}, stop reason {iteration.get('stop_reason')}): the "
            "model was never asked"
        )
    replies = [m for m in log if m.get("role") == "assistant"]
    calls_recorded = {
        (int(r["round"]), int(r.get("position") or 0)): r
        for r in sorted(iteration.get("tool_invocations") or [], key=later_attempt_last)
        if r.get("round") is not None
    }
    final_error = iteration.get("error") if iteration.get("stop_reason") == "llm_error" else None
    model = RecordedModel(replies, final_error)
    try:
        prior = [ChatMessage.from_json(m) for m in head[1:-1]]
    except ValidationError as exc:
        raise ReplayError(f"the stored conversation's head cannot be read back: {exc}") from exc

    started = iteration.get("started_at")
    start = started if isinstance(started, datetime) else datetime.now(UTC)

    def recorded_row(call: ToolCall) -> StoredInvocation | None:
        where = model.position_of(call)
        return calls_recorded.get(where) if where is not None else None

    approvals = {
        (int(a["round"] or 0), int(a["position"] or 0)): approval_of(a)
        for a in iteration.get("approvals") or []
    }
    gate = _gate(config, start, recorded_row, approvals)

    async def execute(call: ToolCall) -> Any:
        row = recorded_row(call)
        if row is None:
            raise ToolError("(rerun) no recorded result: the recorded run did not run this call")
        if row.get("outcome") == "ok":
            return row.get("result")
        if row.get("outcome") == "denied":
            raise ToolError("(rerun) no recorded result: the policy gate refused this call then")
        raise ToolError(str(row.get("error") or "(rerun) recorded as failed"))

    recorded_reminders = _reminders_by_round(iteration.get("reminders") or [])
    channel = None
    if config.reminders:
        replayed = {
            name: _replayed_producer(recorded_reminders, name) for name in _REPLAYED_PRODUCERS
        }
        channel = mission_reminder_channel(
            max_tokens_per_day=config.max_tokens_per_day,
            tokens_used_24h=0,
            deadline=None,
            clock=lambda: start,
            disabled=config.reminders_disabled,
            replace=replayed,
            role=config.reminder_role,
        )
    compactor = None
    archive = sorted(iteration.get("compactions") or [], key=lambda c: c["compaction_index"])
    if config.compact_max_ctx > 0:
        compactor = Compactor(
            llm=RecordedSummariser(archive),
            max_ctx=config.compact_max_ctx,
            model=config.compact_model,
            threshold=config.compact_threshold,
            max_per_iteration=config.compact_max_per_iteration,
            summariser_max_ctx=config.summariser_max_ctx,
        )
    inp = PlannerLoopInput(
        system_prompt=str(head[0].get("content") or ""),
        user_prompt=str(head[-1].get("content") or ""),
        prior_messages=prior,
        tools=list(config.tools),
        max_rounds=config.max_rounds,
        ctx=ToolContext(user_id=config.user_id, mission_id=iteration.get("mission_id")),
        policy=gate,
        reminder_channel=channel,
        compactor=compactor,
    )
    result = await run_planner_loop(inp, llm=model, on_tool_call=execute)
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
    recorded_tools = {str(r["tool"]) for r in calls_recorded.values()}
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
    _compare_calls(report, calls_recorded, executed, config, skip=frozenset(unlisted))
    _compare_compactions(report, archive, compactions)
    _compare_reminders(report, recorded_reminders, [r.to_json() for r in record.reminders])
    recorded_stop = iteration.get("stop_reason")
    unfinished = recorded_stop in (
        None,
        "interrupted",
        "crashed",
        "store_failed",
        "awaiting_approval",
    )
    if unfinished:
        report.notes.append(
            f"the recorded run did not finish (status {iteration.get('status')}, stop reason "
            f"{recorded_stop}): the rerun stops where the recording ends, so its stop reason "
            "and rounds are not compared"
        )
    elif recorded_stop != result.stop_reason:
        report.differences.append(
            {
                "kind": "stop_reason",
                "round": None,
                "recorded": recorded_stop,
                "now": result.stop_reason
                + (f" ({result.error})" if result.error and result.failed else ""),
            }
        )
    if not unfinished and iteration.get("rounds") != result.rounds:
        report.differences.append(
            {
                "kind": "rounds",
                "round": None,
                "recorded": iteration.get("rounds"),
                "now": result.rounds,
            }
        )
    report.compared = {
        "calls": len(calls_recorded),
        "compactions": len(archive),
        "rounds": len(replies),
    }
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
    return report


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


def _reminders_by_round(reminders: Sequence[Row]) -> dict[int, list[Row]]:
    by_round: dict[int, list[Row]] = {}
    for r in reminders:
        by_round.setdefault(int(r.get("round", 0)), []).append(r)
    return by_round


def _replayed_producer(recorded: dict[int, list[Row]], name: str) -> Any:
    def produce(state: LoopState) -> str | None:
        texts = [str(r["text"]) for r in recorded.get(state.round, []) if r["producer"] == name]
        return texts[0] if texts else None

    return produce


def _decision_key(decision: Row | None) -> tuple[Any, ...] | None:
    if not decision:
        return None
    verdict = decision.get("verdict") or ("allow" if decision.get("allow") else "deny")
    reason = decision.get("reason") if verdict == "deny" else None
    return (bool(decision.get("allow")), verdict, reason, tuple(decision.get("flags") or ()))


def _compare_calls(
    report: RerunReport,
    recorded: dict[tuple[int, int], StoredInvocation],
    executed: Sequence[ExecutedCall],
    config: RerunConfig,
    skip: frozenset[str] = frozenset(),
) -> None:
    now = {(c.round, c.index): c for c in executed}
    for key in sorted(set(recorded) | set(now)):
        row, call = recorded.get(key), now.get(key)
        tool = call.call.name if call is not None else str((row or {}).get("tool"))
        if tool in skip:
            continue
        call_id = call.call.id if call is not None else str((row or {}).get("call_id"))
        base = {"round": key[0], "position": key[1], "tool": tool, "call_id": call_id}
        if row is None or call is None:
            report.differences.append(
                base
                | {
                    "kind": "outcome",
                    "recorded": row.get("outcome") if row else "(not called)",
                    "now": _outcome(call) if call else "(not called)",
                }
            )
            continue
        recorded_decision = row.get("policy_decision")
        now_decision = call.decision.model_dump(mode="json") if call.decision else None
        # a call recorded without a gate that a gate now lets through behaves the same
        newly_allowed = recorded_decision is None and (now_decision or {}).get("verdict") == "allow"
        if not newly_allowed and _decision_key(recorded_decision) != _decision_key(now_decision):
            report.differences.append(
                base
                | {
                    "kind": "policy",
                    "recorded": _decision_text(
                        recorded_decision, row.get("policy_mode"), row.get("error")
                    ),
                    "now": _decision_text(now_decision, config.policy_mode, call.error),
                    "now_message": call.decision.message if call.decision else None,
                }
            )
        recorded_outcome = row.get("outcome")
        if recorded_outcome == "unknown":
            recorded_outcome = "error"  # the resumed run answered it with an error result
        outcome = _outcome(call)
        if recorded_outcome != outcome:
            report.differences.append(
                base
                | {
                    "kind": "outcome",
                    "recorded": row.get("outcome"),
                    "now": outcome + (f" ({call.error})" if call.error else ""),
                }
            )
        elif outcome == "error" and (row.get("error") or "") != (call.error or ""):
            report.differences.append(  # still an error, for another reason
                base
                | {
                    "kind": "outcome",
                    "recorded": f"error ({row.get('error')})",
                    "now": f"error ({call.error})",
                }
            )


def _outcome(call: ExecutedCall) -> str:
    """The outcome a call would be stored with: ``parked`` for one that waits for approval."""
    if call.decision is not None and call.decision.parks:
        return "parked"
    return call_outcome(call)


def _decision_text(decision: Row | None, mode: str | None, error: str | None) -> str:
    """A decision in words; without one: no gate, or the call never reached it (why)."""
    text = policy_text(decision, mode)
    if text is not None:
        return text
    if mode in (None, "off"):
        return "no gate (off)"
    return f"not decided: the call never reached the gate ({_short(error or 'no error')})"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _compare_compactions(
    report: RerunReport, archive: Sequence[StoredCompaction], now: Sequence[Row]
) -> None:
    def text(c: Row | None) -> str:
        if c is None:
            return "(none)"
        if c["failed"]:
            return f"a failed attempt before round {c['round']}"
        return f"before round {c['round']}, {c['folded_turns']} turn(s) folded"

    recorded = [
        {
            "round": int(r["round"]),
            "folded_turns": 0 if r.get("error") else int(r["folded_turns"]),
            "failed": bool(r.get("error")),
        }
        for r in archive
    ]
    for index in range(max(len(recorded), len(now))):
        a = recorded[index] if index < len(recorded) else None
        b = now[index] if index < len(now) else None
        if a != b:
            report.differences.append(
                {
                    "kind": "compaction",
                    "round": None,
                    "index": index + 1,
                    "recorded": text(a),
                    "now": text(b),
                }
            )


def _compare_reminders(
    report: RerunReport, recorded: dict[int, list[Row]], now_audit: Sequence[dict[str, object]]
) -> None:
    now = _reminders_by_round([dict(r) for r in now_audit])

    def compared(rows: Sequence[Row]) -> list[str]:
        # a round redone after a takeover was audited twice: once is what counts
        return sorted(
            {f"{r['producer']}: {r['text']}" for r in rows if r["producer"] in COMPARED_PRODUCERS}
        )

    for round_no in sorted(set(recorded) | set(now)):
        a, b = compared(recorded.get(round_no, [])), compared(now.get(round_no, []))
        if a != b:
            report.differences.append(
                {
                    "kind": "reminders",
                    "round": round_no,
                    "recorded": json.dumps(a, ensure_ascii=False) if a else "(none)",
                    "now": json.dumps(b, ensure_ascii=False) if b else "(none)",
                }
            )
