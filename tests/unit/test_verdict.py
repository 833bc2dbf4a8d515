"""``iterations show`` ends with a verdict on what the tools did (``iterations.verdict``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.admin.verdict import unsupported_figures, verdict

CLOCK = {
    "now": "2026-11-29T23:29:59+00:00",
    "date": "2026-11-29",
    "time": "23:29:59",
    "weekday": "Sunday",
    "timezone": "UTC",
    "utc_offset": "+00:00",
    "unix_time_s": 1795994999,
}


def iteration(answer: str | None, *calls: tuple[str, dict[str, Any], Any, str]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What time is it? Use the clock tool."},
    ]
    invocations = []
    for i, (tool, arguments, result, outcome) in enumerate(calls):
        call_id = f"local_{i}"
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [{"id": call_id, "name": tool, "arguments": arguments}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)})
        invocations.append(
            {
                "tool": tool,
                "arguments": arguments,
                "result": result if outcome == "ok" else None,
                "error": None if outcome == "ok" else str(result),
                "outcome": outcome,
            }
        )
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return {
        "status": "succeeded",
        "stop_reason": "final_answer",
        "messages": messages,
        "tool_invocations": invocations,
    }


def test_the_demo_that_said_succeeded_but_made_up_a_time() -> None:
    # the example: a note without a body, and an answer with a time no tool returned
    it = iteration(
        "2026-11-29T23:45:17.861296+00:00",
        ("clock_now", {"timezone": "UTC"}, CLOCK, "ok"),
        ("notes_create", {"title": "time"}, {"id": 1, "title": "time"}, "ok"),
    )
    assert verdict(it) == (
        "verdict: succeeded; tools: clock_now ok (read), notes_create ok (write); "
        "1 of 1 write(s) ran; the answer states 2026-11-29T23:45:17.861296+00:00, "
        "which no tool returned"
    )


def test_an_answer_that_reports_what_the_clock_said() -> None:
    it = iteration("It is 23:29:59 on 2026-11-29.", ("clock_now", {"timezone": "UTC"}, CLOCK, "ok"))
    assert verdict(it) == (
        "verdict: succeeded; tools: clock_now ok (read); nothing was written; "
        "every figure in the answer came from a tool or the objective"
    )


def test_no_tool_failed_calls_and_failed_runs_are_said() -> None:
    assert verdict(iteration("Done.")) == "verdict: succeeded; no tool ran"
    failed = iteration(
        None,
        ("notes_create", {"title": "x"}, "denied by policy", "denied"),
        ("notes_delete", {"id": 3}, "no note with id 3", "error"),
    )
    failed |= {"status": "failed", "stop_reason": "max_rounds"}
    assert verdict(failed) == (
        "verdict: failed (max_rounds); tools: notes_create denied (write), "
        "notes_delete error (destructive); 0 of 2 write(s) ran; no answer"
    )


def test_figures_are_matched_against_what_the_model_was_told() -> None:
    known = json.dumps(CLOCK) + "\nnote 12 was saved"
    assert unsupported_figures("At 23:29 (note 12), 2 calls.", known) == []
    assert unsupported_figures("At 23:45:17, 23:45:17 and 1,234.5.", known) == [
        "23:45:17",
        "1,234.5",
    ]


def test_calls_are_counted_per_tool_and_outcome_not_listed_one_by_one() -> None:
    fetches = [("web_fetch", {"url": f"https://e.example/{n}"}, "page", "ok") for n in range(18)]
    it = iteration(
        "Done.",
        ("clock_now", {"timezone": "UTC"}, CLOCK, "ok"),
        *fetches,
        ("web_fetch", {"url": "https://e.example/x"}, "no such host", "error"),
        ("notes_create", {"title": "a"}, {"id": 1}, "ok"),
        ("notes_create", {"title": "b"}, {"id": 2}, "ok"),
    )
    assert verdict(it) == (
        "verdict: succeeded; tools: clock_now ok (read), web_fetch ok x18 (read), "
        "web_fetch error (read), notes_create ok x2 (write); 2 of 2 write(s) ran"
    )


@pytest.mark.parametrize(
    ("answer", "unsupported"),
    [
        ("It is 5:14 pm on 3 December 2026.", []),
        ("It is 5:14 p.m.", []),
        ("It is 17:14.", []),
        ("The date is 12/3/2026.", []),
        ("The date is 3.12.2026.", []),
        ("Today is 2026/12/03.", []),
        ("It is 6:14 pm.", ["6:14"]),
        ("It is 5:14 am.", ["5:14"]),
        ("The date is 12/4/2026.", ["12/4/2026"]),
        ("That makes 1,234.5 and 12,000.", ["12,000"]),
    ],
)
def test_a_figure_told_another_way_is_not_made_up(answer: str, unsupported: list[str]) -> None:
    # found from outside: "It is 5:14 pm on 3 December 2026." after a clock that said
    # 17:14:27 and 2026-12-03 was listed as a made-up answer
    known = '{"iso": "2026-12-03T17:14:27+00:00", "time": "17:14:27", "date": "2026-12-03"}'
    known += "\nsum: 1234.5"
    assert unsupported_figures(answer, known) == unsupported


@pytest.mark.parametrize(
    ("answer", "known", "unsupported"),
    [
        # invented seconds, minutes or values that a looser match let through
        ("The time is 23:45:17.", '{"utc": "2026-11-29T23:45:02+00:00"}', ["23:45:17"]),
        ("It is 5:14:59 pm.", '{"time": "17:14:27"}', ["5:14:59"]),
        ("It is 14:27.", '{"now": "2026-12-03T17:14:27"}', ["14:27"]),
        ("At 12:14 am.", '{"t": "12:14"}', ["12:14"]),
        ("Total 1,234.", '{"n": 12345}', ["1,234"]),
        ("Score 99.", '{"year": "1990"}', ["99"]),
        # the same values written another way
        ("It is 5.14pm.", '{"time": "17:14:27"}', []),
        ("Date 12/3/26.", '{"date": "2026-12-03"}', []),
        ("Total 1,234.50.", '{"sum": 1234.5}', []),
        ("Total 1234.", '{"sum": "1,234"}', []),
        ("It is 17:14:27.", '{"now": "2026-12-03T17:14:27+00:00"}', []),
        ("It was 2026.", '{"now": "2026-12-03T17:14:27+00:00"}', []),
    ],
)
def test_a_figure_is_held_by_its_value_not_by_a_longer_figure_that_contains_it(
    answer: str, known: str, unsupported: list[str]
) -> None:
    assert unsupported_figures(answer, known) == unsupported
