"""Rerun's comparison: what a rerun (``worker.admin.rerun``) found, and how the calls,
compactions and reminders of today's run are compared with the recorded ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import ExecutedCall
from worker.admin.replay_render import policy_text
from worker.queries.stored import StoredCompaction, StoredInvocation
from worker.store.rows import call_outcome
from worker.terminal_text import visible_line

__all__ = [
    "COMPARED_PRODUCERS",
    "NOT_COMPARED",
    "RerunReport",
    "compare_calls",
    "compare_compactions",
    "compare_reminders",
    "reminders_by_round",
]

Row = dict[str, Any]

COMPARED_PRODUCERS = ("policy_feedback", "retry_loop", "rounds_left", "compacted")
"""Reminder producers whose texts depend on the conversation only, hence compared."""

NOT_COMPARED = (
    "deadline and token_budget reminders: they depend on the time of the run and on the "
    "agent's other runs (the recorded ones are sent again)",
    "rate limits: counted over this iteration's own calls at their recorded times; a call the "
    "limit refused when recorded is refused again (the calls it was counted with are not kept)",
    "tool results and model replies: the recorded ones are replayed",
)


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
    """One difference in words."""
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


def reminders_by_round(reminders: Sequence[Row]) -> dict[int, list[Row]]:
    """A reminder audit (rows with a ``round``) grouped by round."""
    by_round: dict[int, list[Row]] = {}
    for r in reminders:
        by_round.setdefault(int(r.get("round", 0)), []).append(r)
    return by_round


def _decision_key(decision: Row | None) -> tuple[Any, ...] | None:
    """What of a decision is compared: allowed, verdict, the reason of a denial, flags."""
    if not decision:
        return None
    verdict = decision.get("verdict") or ("allow" if decision.get("allow") else "deny")
    reason = decision.get("reason") if verdict == "deny" else None
    return (bool(decision.get("allow")), verdict, reason, tuple(decision.get("flags") or ()))


def compare_calls(
    report: RerunReport,
    recorded: dict[tuple[int, int], StoredInvocation],
    executed: Sequence[ExecutedCall],
    policy_mode: str,
    skip: frozenset[str] = frozenset(),
) -> None:
    """Add to ``report`` where the calls ``executed`` now differ from the ``recorded`` rows
    (keyed by ``(round, position)``): a call made on one side only, a policy decision, an
    outcome. Calls of the tools in ``skip`` are not compared."""
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
        report.differences.extend(base | d for d in _policy_difference(row, call, policy_mode))
        report.differences.extend(base | d for d in _outcome_difference(row, call))


def _policy_difference(row: StoredInvocation, call: ExecutedCall, policy_mode: str) -> list[Row]:
    """The policy difference of a call made on both sides, if its decision changed."""
    recorded_decision = row.get("policy_decision")
    now_decision = call.decision.model_dump(mode="json") if call.decision else None
    # a call recorded without a gate that a gate now lets through behaves the same
    newly_allowed = recorded_decision is None and (now_decision or {}).get("verdict") == "allow"
    if newly_allowed or _decision_key(recorded_decision) == _decision_key(now_decision):
        return []
    return [
        {
            "kind": "policy",
            "recorded": _decision_text(recorded_decision, row.get("policy_mode"), row.get("error")),
            "now": _decision_text(now_decision, policy_mode, call.error),
            "now_message": call.decision.message if call.decision else None,
        }
    ]


def _outcome_difference(row: StoredInvocation, call: ExecutedCall) -> list[Row]:
    """The outcome difference of a call made on both sides: another outcome, or an error
    for another reason."""
    recorded_outcome = row.get("outcome")
    if recorded_outcome == "unknown":
        recorded_outcome = "error"  # the resumed run answered it with an error result
    outcome = _outcome(call)
    if recorded_outcome != outcome:
        return [
            {
                "kind": "outcome",
                "recorded": row.get("outcome"),
                "now": outcome + (f" ({call.error})" if call.error else ""),
            }
        ]
    if outcome == "error" and (row.get("error") or "") != (call.error or ""):
        return [  # still an error, for another reason
            {
                "kind": "outcome",
                "recorded": f"error ({row.get('error')})",
                "now": f"error ({call.error})",
            }
        ]
    return []


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
    """``text`` cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compare_compactions(
    report: RerunReport, archive: Sequence[StoredCompaction], now: Sequence[Row]
) -> None:
    """Add to ``report`` where the compactions ``now`` (``round``, ``folded_turns``,
    ``failed``) differ, one by one, from the recorded ``archive``."""

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


def compare_reminders(
    report: RerunReport, recorded: dict[int, list[Row]], now_audit: Sequence[dict[str, object]]
) -> None:
    """Add to ``report`` the rounds whose reminders of ``COMPARED_PRODUCERS`` differ between
    ``recorded`` (``reminders_by_round``) and the reminder audit ``now_audit``."""
    now = reminders_by_round([dict(r) for r in now_audit])

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
