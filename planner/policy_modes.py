"""The policy gate's modes and its answer to destructive calls, as plain enums: what the
database's CHECK constraints (``worker.db.tables``) and the settings name, importable without
the gate's rules (``planner.policy`` re-exports them; importing it loads the tool layer and
JSON Schema).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["POLICY_MODES", "DestructivePolicy", "PolicyMode"]


class PolicyMode(StrEnum):
    """How the gate's verdicts apply: ``off`` (no gate), ``log-only`` (decided and recorded,
    every call runs), ``enforce`` (a ``deny`` verdict stops the call)."""

    OFF = "off"
    LOG_ONLY = "log-only"
    ENFORCE = "enforce"


POLICY_MODES: tuple[PolicyMode, ...] = tuple(PolicyMode)


class DestructivePolicy(StrEnum):
    """What the gate answers for a destructive call the user has not opted in to: ``deny``
    (refused, the model is told; the default) or ``ask`` (a person is asked first:
    ``planner.approvals``). ``MANA_AI_POLICY_DESTRUCTIVE``, overridable per agent."""

    DENY = "deny"
    ASK = "ask"
