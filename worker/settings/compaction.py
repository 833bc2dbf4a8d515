"""When a conversation is compacted: ``CompactionSettings`` (``Settings.compaction``,
``MANA_AI_COMPACT_*``). The summarising endpoint is ``Settings.llm.compaction``."""

from __future__ import annotations

from pydantic import Field

from worker.settings.values import MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS, ContextTokens, Section

__all__ = ["CompactionSettings"]


class CompactionSettings(Section):
    """``MANA_AI_COMPACT_MAX_CTX``, ``_COMPACT_THRESHOLD``, ``_COMPACT_MAX_PER_ITERATION`` and
    ``_COMPACT_MODEL_MAX_CTX``."""

    max_ctx: ContextTokens = Field(
        default=1_000_000,
        ge=0,
        le=MAX_CONTEXT_TOKENS,
        description=(
            "The mission model's context in tokens: when a conversation reaches "
            "MANA_AI_COMPACT_THRESHOLD of it, its middle is summarised and archived "
            "(compaction). 0 turns compaction off; otherwise 256 to 100000000. An agent's "
            "--compact-max-ctx overrides it (models differ). Default 1000000."
        ),
    )
    threshold: float = Field(
        default=0.92,
        ge=0.5,
        le=1.0,
        description="Share of the context (0.5-1) at which compaction starts. Default 0.92.",
    )
    max_per_iteration: int = Field(
        default=1,
        ge=1,
        le=10,
        description=(
            "Compactions tried per iteration (1-10), failed ones included; a conversation "
            "that crosses the threshold again after that ends with stop reason "
            "context_exhausted instead of sending an over-long request. Default 1."
        ),
    )
    model_max_ctx: int | None = Field(
        default=None,
        ge=MIN_CONTEXT_TOKENS,
        le=MAX_CONTEXT_TOKENS,
        description=(
            "The summarising model's own context in tokens (256 to 100000000): a quarter of "
            "it is left for the summary, and the turns it is asked to summarise are trimmed "
            "(oldest first) to fit the rest; all of them are still archived. Unset: the "
            "mission's context (MANA_AI_COMPACT_MAX_CTX or the agent's --compact-max-ctx)."
        ),
    )
