"""Reminder producers, table-driven at, just below and just above their thresholds; the
composer's order, limits, de-duplication and isolation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from planner import (
    ExecutedCall,
    LoopState,
    PlannerLoopInput,
    PolicyDecision,
    Reminder,
    TokenUsage,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.testing import ScriptedChatModel, final_answer, tool_calls
from reminders import (
    Producer,
    ReminderComposer,
    RetryLoopWatch,
    compacted_reminder,
    deadline_reminder,
    policy_feedback_reminder,
    retry_loop_reminder,
    rounds_left_reminder,
    token_budget_reminder,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def executed(
    decision: PolicyDecision | None = None,
    name: str = "notes_delete",
    args: dict[str, Any] | None = None,
    error: str | None = None,
) -> ExecutedCall:
    if decision is not None and not decision.allow:
        error = "denied"
    return ExecutedCall(2, ToolCall(id="c", name=name, arguments=args or {}), None, error, decision)


async def _nothing(args: dict[str, Any], ctx: ToolContext) -> str:
    return "nothing"


def state(
    *calls: ExecutedCall, round: int = 3, compactions: int = 0, max_rounds: int = 5
) -> LoopState:
    return LoopState(
        round=round,
        tool_call_count=len(calls),
        tokens_used=TokenUsage(),
        last_call=calls[-1] if calls else None,
        compactions_done=compactions,
        max_rounds=max_rounds,
        last_round_calls=calls,
    )


# -- token budget (threshold 75 %) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "used", "expected"),
    [
        (None, 10_000, None),
        (10_000, 0, None),
        (10_000, 7_499, None),  # just below 75 %
        (10_000, 7_500, "75 %"),  # at the threshold
        (10_000, 7_501, "75 %"),  # just above
        (10_000, 8_000, "80 % of the agent's daily token budget is used (8,000 of 10,000"),
        (10_000, 9_999, "99 %"),
        (10_000, 10_000, "budget is used up"),
        (10_000, 25_000, "budget is used up (25,000 of 10,000"),
    ],
)
def test_token_budget_reminder(budget: int | None, used: int, expected: str | None) -> None:
    text = token_budget_reminder(budget, used)
    assert (text is None) == (expected is None)
    if expected:
        assert expected in (text or "")


def test_token_budget_threshold_is_a_parameter() -> None:
    assert token_budget_reminder(100, 50, threshold=0.5) is not None
    assert token_budget_reminder(100, 49, threshold=0.5) is None


# -- rounds left (two or fewer) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("round", "max_rounds", "expected"),
    [
        (1, 5, None),
        (3, 5, None),  # 3 left: just above the threshold
        (4, 5, "Round 4 of 5: 2 rounds left, this one included. Finish or save progress."),
        (5, 5, "Round 5 of 5, the last one"),
        (1, 1, None),  # a one-round agent would hear it on every request
        (1, 2, None),  # an agent that always has two rounds or fewer hears of its last only
        (2, 2, "Round 2 of 2, the last one"),
        (2, 3, "Round 2 of 3: 2 rounds left"),
        (6, 5, None),  # past the end: nothing sensible to say
    ],
)
def test_rounds_left_reminder(round: int, max_rounds: int, expected: str | None) -> None:
    text = rounds_left_reminder(state(round=round, max_rounds=max_rounds), max_rounds)
    assert (text is None) == (expected is None)
    if expected:
        assert expected in (text or "")


def test_rounds_left_threshold_is_a_parameter() -> None:
    assert rounds_left_reminder(state(round=3), 5, when_left=3) is not None
    assert rounds_left_reminder(state(round=4), 5, when_left=1) is None


# -- retry loop (3 in a row) ---------------------------------------------------------------------

FAIL = "no note with id 7"
SAME_FAILING = [executed(name="notes_read", args={"id": 7}, error=FAIL)] * 3
SAME_OK = [executed(name="clock_now", args={"tz": "UTC"})] * 3


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([], None),
        (SAME_FAILING[:2], None),  # just below: two in a row
        (
            SAME_FAILING,
            "You called notes_read with the same arguments 3 times in a row and it failed",
        ),
        (SAME_FAILING * 2, "3 times in a row"),  # above: still a loop
        (SAME_OK, "You called clock_now with the same arguments 3 times in a row. Unless you"),
        (
            [executed(name="notes_read", args={"id": n}, error=FAIL) for n in (1, 2, 3)],
            "notes_read failed 3 times in a row (last error: no note with id 7)",
        ),
        ([executed(name="notes_read", args={"id": n}) for n in (1, 2, 3)], None),  # progress
        ([*SAME_FAILING[:2], executed(name="notes_list")], None),  # broke the loop
        (
            [SAME_FAILING[0], executed(name="notes_read", args={"id": 7}), SAME_FAILING[0]],
            "same arguments",
        ),
        (
            # arguments compared canonically: key order does not matter
            [
                executed(name="notes_search", args={"query": "x", "limit": 5}),
                executed(name="notes_search", args={"limit": 5, "query": "x"}),
                executed(name="notes_search", args={"query": "x", "limit": 5}),
            ],
            "notes_search with the same arguments 3 times",
        ),
    ],
)
def test_retry_loop_reminder(history: list[ExecutedCall], expected: str | None) -> None:
    text = retry_loop_reminder(state(), history)
    assert (text is None) == (expected is None), text
    if expected:
        assert expected in (text or "")


def test_retry_loop_threshold_is_a_parameter() -> None:
    assert retry_loop_reminder(state(), SAME_FAILING[:2], repeats=2) is not None
    assert retry_loop_reminder(state(), SAME_FAILING, repeats=4) is None


def test_retry_loop_watch_follows_the_rounds_and_reads_each_round_once() -> None:
    watch = RetryLoopWatch()
    call = SAME_FAILING[0]
    assert watch(state(round=1)) is None
    assert watch(state(call, round=2)) is None
    assert watch(state(call, round=2)) is None  # asked twice for one round: counted once
    assert watch(state(call, round=3)) is None
    assert "3 times in a row" in (watch(state(call, round=4)) or "")
    assert watch(state(executed(name="notes_list"), round=5)) is None


# -- deadline (within 30 min) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline", "expected"),
    [
        (None, None),
        (NOW + timedelta(minutes=31), None),  # just outside
        (NOW + timedelta(minutes=30), "deadline is in 30 minutes"),  # at the threshold
        (NOW + timedelta(minutes=29), "deadline is in 29 minutes"),
        (NOW + timedelta(seconds=20), "deadline is in 1 minute "),
        (NOW, "passed 1 minute ago"),
        (NOW - timedelta(hours=3), "passed 3 hours ago"),
    ],
)
def test_deadline_reminder(deadline: datetime | None, expected: str | None) -> None:
    text = deadline_reminder(deadline, NOW)
    assert (text is None) == (expected is None), text
    if expected:
        assert expected in (text or "")


def test_deadline_threshold_is_a_parameter() -> None:
    assert deadline_reminder(NOW + timedelta(hours=2), NOW, within=timedelta(hours=3)) is not None


# -- policy feedback, compacted -------------------------------------------------------------------

REFUSED = PolicyDecision(allow=False, reason="destructive_not_opted_in", reminder="needs opt-in")
RATE = PolicyDecision(allow=False, reason="rate_limited", reminder="rate-limited")
WOULD_DENY = PolicyDecision(allow=True, reason="rate_limited", verdict="deny", reminder=None)
NO_TEXT = PolicyDecision(allow=False, reason="x")


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ((), None),
        ((executed(None),), None),
        ((executed(PolicyDecision(allow=True)),), None),
        ((executed(WOULD_DENY),), None),
        ((executed(NO_TEXT),), None),
        ((executed(REFUSED),), "needs opt-in"),
        ((executed(REFUSED), executed(REFUSED)), "needs opt-in"),
        ((executed(REFUSED), executed(None), executed(RATE)), "needs opt-in\nrate-limited"),
    ],
)
def test_policy_feedback_reminder(calls: tuple[ExecutedCall, ...], expected: str | None) -> None:
    assert policy_feedback_reminder(state(*calls)) == expected


@pytest.mark.parametrize(
    ("compactions", "expected"),
    [(0, None), (1, "summarised to fit the context (once)"), (2, "(2 times)")],
)
def test_compacted_reminder(compactions: int, expected: str | None) -> None:
    text = compacted_reminder(state(compactions=compactions))
    assert (text is None) == (expected is None)
    if expected:
        assert expected in (text or "")


# -- the composer -------------------------------------------------------------------------------


def fixed(text: str | None) -> Any:
    return lambda _state: text


def test_composer_orders_by_severity_and_names_each_producer_and_role() -> None:
    composer = ReminderComposer(
        [
            Producer("info", "info", fixed("i")),
            Producer("warn", "warning", fixed("w")),
            Producer("none", "critical", fixed(None)),
            Producer("crit", "critical", fixed("c")),
        ],
        role="user",
    )
    assert composer(state(round=2)) == [
        Reminder("c", "crit", "user"),
        Reminder("w", "warn", "user"),
        Reminder("i", "info", "user"),
    ]


async def test_what_was_sent_is_in_the_runs_record_round_by_round() -> None:
    composer = ReminderComposer([Producer("rounds", "warning", lambda s: f"round {s.round}")])
    llm = ScriptedChatModel([tool_calls(("look", {})), final_answer("done")])
    look = ToolSpec("look", "Look.", {"type": "object"}, "read", _nothing)
    result = await run_planner_loop(
        PlannerLoopInput(
            system_prompt="s", user_prompt="u", tools=[look], reminder_channel=composer
        ),
        llm=llm,
    )
    llm.assert_exhausted()
    assert [r.to_json() for r in result.record.reminders] == [
        {"round": 1, "producer": "rounds", "text": "round 1"},
        {"round": 2, "producer": "rounds", "text": "round 2"},
    ]
    assert not any("round 1" in (m.content or "") for m in result.messages)  # never stored


def test_composer_deduplicates_and_caps_count_and_characters() -> None:
    composer = ReminderComposer(
        [
            Producer("a", "warning", fixed("same")),
            Producer("b", "warning", fixed("same")),
            Producer("c", "info", fixed("x" * 50)),
            Producer("d", "info", fixed("y")),
            Producer("e", "info", fixed("z")),
        ],
        max_reminders=3,
        max_chars=30,
    )
    # "same" once; the 50-character text does not fit next to it; "y" and "z" do
    sent = composer(state())
    assert [r.text for r in sent] == ["same", "y", "z"]
    assert [r.producer for r in sent] == ["a", "d", "e"]


def test_a_single_text_longer_than_the_budget_is_cut() -> None:
    composer = ReminderComposer([Producer("long", "warning", fixed("w" * 5000))], max_chars=100)
    [reminder] = composer(state())
    assert len(reminder.text) == 100 and reminder.text.endswith("…")


def test_a_producer_that_raises_is_skipped_and_reported() -> None:
    errors: list[tuple[str, str]] = []

    def broken(_state: LoopState) -> str | None:
        raise ZeroDivisionError("oops")

    composer = ReminderComposer(
        [Producer("broken", "critical", broken), Producer("ok", "info", fixed("still here"))],
        on_error=lambda name, exc: errors.append((name, str(exc))),
    )
    assert [r.text for r in composer(state())] == ["still here"]
    assert errors == [("broken", "oops")]


def test_blank_texts_are_not_sent() -> None:
    composer = ReminderComposer([Producer("blank", "info", fixed("   "))])
    assert composer(state()) == []


def test_retry_loop_watch_agrees_with_the_function_on_random_histories() -> None:
    import random

    rng = random.Random(7)
    for _ in range(300):
        watch = RetryLoopWatch()
        history: list[ExecutedCall] = []
        previous: tuple[ExecutedCall, ...] = ()
        for round_no in range(1, 9):
            now = state(*previous, round=round_no)
            assert watch(now) == retry_loop_reminder(now, history), history
            previous = tuple(
                executed(
                    name=rng.choice(["a", "b"]),
                    args={"x": rng.choice([0, 1])},
                    error=rng.choice([None, "boom"]),
                )
                for _ in range(rng.choice([1, 1, 2, 3]))
            )
            history += previous
