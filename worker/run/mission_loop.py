"""The planner loop as one mission runs it: ``MissionLoop.run`` builds what the loop needs for
a claimed mission (its tools with the worker's timeout and secrets masked, its MCP servers'
tools, the gate bound to the run's lease and journal, the resume of a takeover) and runs
``planner.run_planner_loop`` with the run's journal, metrics and trace as its sink.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import (
    Approval,
    ChatModel,
    Checkpoint,
    PlannerLoopInput,
    PlannerLoopResult,
    PolicyGate,
    ReminderChannel,
    RunEvent,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from planner.compaction import Compactor
from planner.policy import POLICY_MODES, DestructivePolicy, PolicyMode
from planner.tools import ToolHandler
from worker import redaction
from worker.mcp.config import mcp_scope
from worker.mcp.sources import McpToolSources, ToolSourceError
from worker.policy_setup import PolicySetup
from worker.run.journal import MissionJournal
from worker.run.mission_gate import LeaseBoundLedger, MissionGate
from worker.run.resume import resume_checkpoint
from worker.run.run_metrics import RunMetrics
from worker.store.records import ClaimedMission, StartedIteration
from worker.tracing.hooks import RunTracing, traced_run

__all__ = ["MissionLoop", "RunState", "ToolsFactory"]

logger = logging.getLogger(__name__)

ToolsFactory = Callable[[ClaimedMission], Sequence[ToolSpec]]
"""``mission -> tools`` the mission's agent may call (already filtered to its allow-list)."""

_TIMED_SPECS = 1024
"""Specs ``MissionLoop._offered`` keeps with the worker's timeout (the built-in tools are a
handful; a ``tools_for`` that makes new specs per mission clears the cache now and then)."""


@dataclass
class RunState:
    """What one run keeps besides its record, filled in as it goes: its iteration and
    journal (which folds the record), the names of the tools it offered (metric labels), what
    its tool sources left out, and the approvals of calls whose outcome a takeover found
    unknown (``standing``)."""

    iteration: StartedIteration | None = None
    journal: MissionJournal | None = None
    tool_names: frozenset[str] = frozenset()
    source_problems: list[str] = field(default_factory=list)
    standing: tuple[Approval, ...] = ()


@dataclass
class MissionLoop:
    """The loop's configuration for every mission of a worker (see ``MissionRunner``'s
    arguments of the same names)."""

    llm: ChatModel
    tools_for: ToolsFactory
    policy: PolicySetup | None = None
    max_parallel_reads: int = 10
    tool_timeout_s: float | None = 60.0
    tool_sources: McpToolSources | None = None
    tracing: RunTracing | None = None
    _timed: dict[int, tuple[ToolSpec, ToolSpec]] = field(default_factory=dict)

    def policy_mode(self, mission: ClaimedMission) -> PolicyMode:
        """The policy mode this mission's calls run under (recorded on each invocation)."""
        if self.policy is None:
            return PolicyMode.OFF
        return _policy_mode_or_none(mission.policy_mode) or self.policy.default_mode

    async def run(
        self,
        mission: ClaimedMission,
        model: str | None,
        state: RunState,
        channel: ReminderChannel | None,
        compactor: Compactor | None,
    ) -> PlannerLoopResult:
        """Run the loop for ``mission``'s iteration (``state.iteration`` and ``state.journal``
        are set); the loop's result.

        Raises:
            ToolSourceError: a required MCP server could not be used.
            Whatever the loop raises (``RunInterrupted``, a lost lease, cancellation).
        """
        iteration, journal = state.iteration, state.journal
        assert iteration is not None and journal is not None
        ctx = ToolContext(
            user_id=mission.owner_user_id,
            agent_id=mission.agent_id,
            mission_id=mission.id,
            iteration_id=iteration.id,
        )
        tools = self._offered(mission)
        async with contextlib.AsyncExitStack() as sources:  # MCP sessions: this run only
            opened = await self._open_tool_sources(mission, sources, tools, state.source_problems)
            tools += [self._with_timeout(t) for t in opened]
            state.tool_names = frozenset(t.name for t in tools)
            tools = [journal.bound(t) for t in tools]
            journal.specs = {t.name: t for t in tools}
            resume = await self._resume(iteration, journal, ctx, state)
            inp = PlannerLoopInput(
                system_prompt=mission.system_prompt,
                user_prompt=mission.objective,
                tools=tools,
                max_rounds=mission.max_rounds,
                model=model,
                reminder_channel=channel,
                ctx=ctx,
                policy=self._gate(mission, journal),
                compactor=compactor,
                max_parallel_reads=self.max_parallel_reads,
                resume=resume,
            )
            observed = RunMetrics()

            async def sink(event: RunEvent) -> None:
                observed(event)
                await journal(event)

            tracing = self.tracing
            async with traced_run(
                tracing, mission, iteration, model, sink, state.tool_names
            ) as traced:
                return await run_planner_loop(inp, llm=self.llm, sink=traced)

    async def _resume(
        self,
        iteration: StartedIteration,
        journal: MissionJournal,
        ctx: ToolContext,
        state: RunState,
    ) -> Checkpoint | None:
        """A takeover's checkpoint (``None``: a fresh run), with the journal's stored rows."""
        if not iteration.resumable:
            return None
        resume, journal.rows = await resume_checkpoint(iteration, specs=journal.specs, ctx=ctx)
        state.standing = tuple(resume.standing_approvals)
        unknown = sum(c.outcome_unknown for c in resume.settled.values())
        decided = ", ".join(
            f"request {a.request_id} {a.status.value}" for a in resume.approvals.values()
        )
        if decided and not unknown:  # a parked run going on: routine, not a fault
            logger.info(
                "resuming after round %d with the decision on its approval (%s)",
                resume.rounds_done,
                decided,
            )
        else:
            logger.warning(
                "resuming after round %d of attempt %d (%d call(s) in flight with an unknown "
                "outcome: not run again)",
                resume.rounds_done,
                iteration.attempt - 1,
                unknown,
            )
        return resume

    def _gate(self, mission: ClaimedMission, journal: MissionJournal) -> PolicyGate | None:
        """The run's policy gate (``None``: no gate), its ledger bound to the run's lease."""
        lease = journal.lease
        if self.policy is None or lease is None:
            return None
        rules = self.policy.gate(
            user_settings=mission.user_policy,
            mode=_policy_mode_or_none(mission.policy_mode),
            destructive=_destructive_or_none(mission.destructive_policy),
            # enforce: an unreachable ledger interrupts the run instead of denying calls
            # (log-only fails open at once: it must never hold a call up)
            ledger=(
                LeaseBoundLedger(self.policy.ledger, lease)
                if self.policy_mode(mission) == "enforce"
                else None
            ),
        )
        return MissionGate(rules, journal) if rules is not None else None

    def _with_timeout(self, spec: ToolSpec) -> ToolSpec:
        """``spec`` with the worker's tool timeout when it sets none of its own, and its
        results and errors with the process's secrets masked (``worker.redaction``: an MCP
        server or a page that echoes a key never hands it to the model)."""
        timeout_s = spec.timeout_s if spec.timeout_s is not None else self.tool_timeout_s
        return dataclasses.replace(spec, timeout_s=timeout_s, handler=_masking(spec.handler))

    def _offered(self, mission: ClaimedMission) -> list[ToolSpec]:
        """``tools_for(mission)`` with the worker's tool timeout, each spec made once per
        spec ``tools_for`` returns (a spec checks its schema when made, and compiles its
        validator on first use), kept by identity with the spec it came from, at most
        ``_TIMED_SPECS``."""
        offered = []
        for spec in self.tools_for(mission):
            kept = self._timed.get(id(spec))
            if kept is None or kept[0] is not spec:
                if len(self._timed) >= _TIMED_SPECS:
                    self._timed.clear()
                kept = self._timed[id(spec)] = (spec, self._with_timeout(spec))
            offered.append(kept[1])
        return offered

    async def _open_tool_sources(
        self,
        mission: ClaimedMission,
        stack: contextlib.AsyncExitStack,
        offered: Sequence[ToolSpec],
        problems: list[str],
    ) -> list[ToolSpec]:
        """The tools of the agent's MCP servers that missions may use; their sessions close
        with ``stack``. What was left out goes to ``problems``.

        Raises:
            ToolSourceError: a required server could not be used.
        """
        if not mission.mcp_servers:
            return []
        if self.tool_sources is None:
            problems.append(
                "the agent's MCP servers were not used: this worker has no MCP tool sources"
            )
            return []
        exposed = self.policy.config.exposed_scopes if self.policy is not None else None
        servers = []
        for server in mission.mcp_servers:
            if exposed is None or mcp_scope(server.name) in exposed:
                servers.append(server)
                continue
            reason = (
                f"MCP server {server.name} not used: its scope {mcp_scope(server.name)} is not "
                "in MANA_AI_POLICY_MISSION_SCOPES"
            )
            if server.required:
                raise ToolSourceError(f"{reason} (the server is required)")
            problems.append(reason)
        opened = await self.tool_sources.open(
            servers, stack, reserved=frozenset(t.name for t in offered)
        )
        problems.extend(opened.problems)
        return opened.tools


def _masking(handler: ToolHandler) -> ToolHandler:
    """``handler`` whose result (JSON data or text) and error message have the process's
    secrets masked (``worker.redaction``)."""

    async def handle(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        try:
            result = await handler(arguments, ctx)
        except Exception as exc:
            masking = redaction.redactor()
            if masking and masking.found(str(exc)):
                exc.args = tuple(masking.text(a) if isinstance(a, str) else a for a in exc.args)
            raise
        masking = redaction.redactor()
        if masking and isinstance(result, str | dict | list):
            return masking.json(result)
        return result

    return handle


def _policy_mode_or_none(value: str | None) -> PolicyMode | None:
    return PolicyMode(value) if value in POLICY_MODES else None


def _destructive_or_none(value: str | None) -> DestructivePolicy | None:
    return DestructivePolicy(value) if value in tuple(DestructivePolicy) else None
