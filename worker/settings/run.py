"""How one mission runs: ``RunSettings`` (``Settings.run``): checkpoints, tool calls and the
reminder channel."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from worker.settings.values import DAY_S, CaseInsensitive, OnOff, ReminderProducers, Section

__all__ = ["RunSettings"]


class RunSettings(Section):
    """``MANA_AI_CHECKPOINT_EVERY_ROUNDS``, ``_MAX_PARALLEL_READS``, ``_TOOL_TIMEOUT_S``,
    ``_REMINDERS``, ``_REMINDERS_DISABLED`` and ``_REMINDER_ROLE``."""

    checkpoint_every_rounds: int = Field(
        default=3,
        ge=1,
        le=1000,
        description=(
            "A running mission stores a checkpoint after every round that ran a write or "
            "destructive tool call, and at least every this many rounds otherwise (read-only "
            "rounds are cheap to redo). A worker taking over a mission whose worker died "
            "resumes from the last checkpoint (1 to 1000). Default 3."
        ),
    )
    max_parallel_reads: int = Field(
        default=10,
        ge=1,
        le=100,
        description=(
            "Read-only tool calls of one round that run at once, at most (1-100). A finished "
            "call's slot is refilled at once; write and destructive calls always run alone, "
            "after every call before them. 1 runs every call one by one."
        ),
    )
    tool_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=DAY_S,
        description=(
            "Seconds (at most 86400) one tool call may run before it is stopped and the model "
            "gets an error result saying so (for a write: that its outcome is unknown). A tool "
            "may set its own limit (web_fetch: MANA_AI_WEB_TIMEOUT_S + 5)."
        ),
    )
    reminders: OnOff = Field(
        default="on",
        description=(
            "Send the reminder channel's hints (policy refusals, retry loops, rounds and token "
            "budget left, a close deadline, compaction) with each LLM request, as "
            "<reminder> system messages that are never stored in the message log; each "
            "iteration records what was sent. 'on' or 'off'. Default on."
        ),
    )
    reminders_disabled: ReminderProducers = Field(
        default=(),
        description=(
            "Reminder producers to leave out, separated by commas: policy_feedback, "
            "retry_loop, rounds_left, deadline, token_budget, compacted. Unset: none is left "
            "out."
        ),
    )
    reminder_role: Annotated[Literal["system", "user"], CaseInsensitive] = Field(
        default="system",
        description=(
            "The role reminders are sent with: 'system' (default) or 'user'. Set 'user' for "
            "endpoints whose chat template refuses a system message after the first one "
            "(e.g. Mistral's and Gemma's templates on vLLM or Ollama answer 400 or 500)."
        ),
    )
