"""The fixed core names of shared/DESIGN.md stay importable from the packages themselves."""

from __future__ import annotations

import planner

CORE_NAMES = {
    "ChatModel",
    "ChatMessage",
    "ToolCall",
    "TokenUsage",
    "CompletionRequest",
    "CompletionResponse",
    "LoopState",
    "ExecutedCall",
    "PlannerLoopInput",
    "run_planner_loop",
    "PlannerLoopResult",
    "ToolSpec",
    "ToolContext",
    "PolicyDecision",
    "PolicyInput",
    "evaluate_policy",
}


def test_reminder_producers_are_exported_from_reminders() -> None:
    import reminders

    assert "policy_feedback_reminder" in reminders.__all__


def test_core_names_are_exported_from_planner() -> None:
    missing = CORE_NAMES - set(planner.__all__)
    assert not missing, f"not in planner.__all__: {sorted(missing)}"
    for name in planner.__all__:
        assert getattr(planner, name) is not None


def test_all_is_sorted_and_unique() -> None:
    assert list(planner.__all__) == sorted(set(planner.__all__))
