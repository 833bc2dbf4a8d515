"""How a run ends, in the store (``MissionStore.end_run``): one statement per kind of end,
built once, each all or nothing under the run's lease, safe to run again (a repeat finds what
the first stored: ``stored``).

* ``finished``: the run's end (``parts.ended``: status, stop reason, error, its log and
  tokens), its calls and compactions not stored yet, and the mission's next run with the
  lease released (``parts.schedule_moved``); ``finished_and_claimed(limit)`` also claims up
  to ``limit`` of this worker's next due missions (``worker.store.claim``), never the
  finished one, in the same round trip;
* ``interrupted``: the run stored ``failed`` / ``interrupted`` with its checkpoint (``None``s:
  the one stored stays), the lease released, the schedule as it was (the next claim takes the
  same run over);
* ``parked``: the run at the call a person must decide on (``awaiting_approval``), its
  checkpoint and calls (the parked one's row ``parked``), the approval request, the lease
  released, the schedule as it was;
* ``moved_on``: no run (a skipped or missed run, a mission completed past its deadline): the
  schedule moved on, and the mission's runs parked for approval ended.

Bound: ``p_mission_id``, ``p_worker_id``; with an iteration ``p_iteration_id``, ``p_attempt``,
``p_status``, ``p_stop_reason``, ``p_error``, the checkpoint's parameters, ``p_new_calls``,
``p_known_calls``, ``p_archive``; a schedule moved: ``p_next_run_at``, ``p_mission_status``,
``p_last_error``; parked: ``p_`` + ``parts.APPROVAL_KEYS`` and ``p_ttl``; a claim:
``worker.store.claim.claim_parameters``. One row (a claim: one per claimed mission, or one
whose claim columns are NULL): ``owned``, ``stored``, ``calls`` (parked: the request's
``approval_id``, ``approval_created``, ``approval_expires_at``).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import literal_column, select

from worker.store.claim import claim_select
from worker.store.writes import parts

__all__ = ["finished", "finished_and_claimed", "interrupted", "moved_on", "parked"]


def _run_ended(stmt: parts.Statement) -> parts.Statement:
    parts.ended(stmt)
    parts.calls(stmt)
    parts.archive(stmt)
    return stmt


@functools.cache
def finished() -> Any:
    """A run that ended, and the mission's next run (see the module docstring)."""
    return _run_ended(parts.schedule_moved()).select()


@functools.cache
def finished_and_claimed(limit: int | None) -> Any:
    """``finished`` that also claims up to ``limit`` due missions (``None``: the limit is
    bound, ``p_claim_limit``; else written in the statement, one statement per limit: see
    ``worker.store.claim.LITERAL_LIMITS``): one row per claimed mission, each with the
    claim's columns (``worker.store.claim.claimed_mission``), or one whose claim columns are
    NULL when none was claimed."""
    stmt = _run_ended(parts.schedule_moved())
    claims = claim_select(after_finish=True, finished_tokens=True, limit=limit).subquery("claims")
    one = select(literal_column("1").label("one")).subquery("one")
    return (
        select(*stmt.columns, *claims.c)
        .select_from(one.outerjoin(claims, literal_column("true")))
        .add_cte(stmt.owner, *stmt.writes)
    )


@functools.cache
def interrupted() -> Any:
    """A run interrupted, to be taken over (see the module docstring)."""
    return _run_ended(parts.lease_released()).select()


@functools.cache
def parked() -> Any:
    """A run parked for a person's approval (see the module docstring)."""
    stmt = _run_ended(parts.lease_released())
    parts.approval_request(stmt)
    return stmt.select()


@functools.cache
def moved_on() -> Any:
    """No run: the schedule moved on (see the module docstring)."""
    stmt = parts.schedule_moved()
    parts.parked_runs_ended(stmt)
    return stmt.select()
