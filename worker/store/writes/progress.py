"""The writes a run makes as it goes, under its lease (``MissionStore.record_call_start`` and
``commit_round``): one statement each, built once.

* ``checkpoint``: the log so far, the round's calls not stored yet (new rows inserted,
  journaled ones brought up to date) and the compactions not stored yet: a round's commit,
  the checkpoint a takeover resumes from, and, before a write or destructive call runs, its
  start (the log then ends with the assistant message that issued it, and the rows hold the
  call's ``started`` one);
* ``reserved_checkpoint``: a call's start after reserving its rate-limit slot
  (``mana_ai_reserve_tool_call``, as the gate's ledger does), the ``started`` row stored only
  when a slot was taken or ``p_run_anyway`` (log-only runs a refused call too): the gate's
  reservation and the call's start in one round trip.

Bound: ``p_mission_id``, ``p_worker_id``, ``p_iteration_id``, the checkpoint's
(``parts.checkpoint``), ``p_new_calls``, ``p_known_calls``, ``p_archive``; a reserved start also
``p_user_id``, ``p_tool``, ``p_consumer``, ``p_window``, ``p_limit``, ``p_run_anyway``. One
row: ``owned``, ``calls`` (and ``reserved``, ``checked_at``, ``recent``).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Integer,
    Interval,
    Text,
    bindparam,
    column,
    func,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY

from worker.store.writes import parts

__all__ = ["checkpoint", "reserved_checkpoint"]


@functools.cache
def checkpoint() -> Any:
    """The checkpoint, the calls, the archive (see the module docstring)."""
    stmt = parts.lease_check()
    parts.checkpoint(stmt)
    parts.calls(stmt)
    parts.archive(stmt)
    return stmt.select()


@functools.cache
def reserved_checkpoint() -> Any:
    """A call's start after its rate-limit reservation (see the module docstring)."""
    reservation = (
        select(
            column("reserved", Boolean),
            column("checked_at", DateTime(timezone=True)),
            column("recent", ARRAY(DateTime(timezone=True))),
        )
        .select_from(
            func.mana_ai_reserve_tool_call(
                bindparam("p_user_id", type_=Text),
                bindparam("p_tool", type_=Text),
                bindparam("p_consumer", type_=Text),
                bindparam("p_window", type_=Interval),
                bindparam("p_limit", type_=Integer),
            )
        )
        .cte("reservation")
    )
    stmt = parts.lease_check()
    stmt.columns += [
        select(reservation.c.reserved).scalar_subquery().label("reserved"),
        select(reservation.c.checked_at).scalar_subquery().label("checked_at"),
        select(reservation.c.recent).scalar_subquery().label("recent"),
    ]
    may_start = or_(
        select(reservation.c.reserved).scalar_subquery(),
        bindparam("p_run_anyway", type_=Boolean),
    )
    parts.checkpoint(stmt)
    parts.calls(stmt, may_start)
    parts.archive(stmt)
    return stmt.select(reservation)
