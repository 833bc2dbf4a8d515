"""How a worker's missions compact their context, from the settings: the summariser and the
limits, and each mission's ``Compactor`` (an agent's ``compact_max_ctx`` overrides the
default)."""

from __future__ import annotations

from dataclasses import dataclass

from planner import ChatModel
from planner.compaction import Compactor
from worker.store.records import ClaimedMission

__all__ = ["CompactionSetup"]


@dataclass(frozen=True)
class CompactionSetup:
    """How missions compact their context (``planner.compaction``), from the settings.

    Attributes:
        llm: the summariser (the missions' model, or ``MANA_AI_COMPACT_BASE_URL``'s).
        max_ctx: the default context in tokens (an agent's ``compact_max_ctx`` overrides it);
            0 turns compaction off.
        model: the summariser's model (``MANA_AI_COMPACT_MODEL``); ``None``: the mission's.
        threshold, max_per_iteration, summariser_max_ctx: see ``Compactor``.
    """

    llm: ChatModel
    max_ctx: int
    threshold: float = 0.92
    max_per_iteration: int = 1
    model: str | None = None
    summariser_max_ctx: int | None = None

    def compactor_for(
        self, mission: ClaimedMission, mission_model: str | None = None
    ) -> Compactor | None:
        """The mission's Compactor (summarising with ``model``, else ``mission_model``: the
        model the mission's requests name), or ``None`` when its context is 0 (off)."""
        max_ctx = mission.compact_max_ctx if mission.compact_max_ctx is not None else self.max_ctx
        if max_ctx <= 0:
            return None
        return Compactor(
            llm=self.llm,
            max_ctx=max_ctx,
            model=self.model or mission_model,
            threshold=self.threshold,
            max_per_iteration=self.max_per_iteration,
            summariser_max_ctx=self.summariser_max_ctx,
        )
