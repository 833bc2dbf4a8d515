"""The one statement that persists a run's progress: a checkpoint, a journaled call's start,
an interruption, or the end of the run.

Every write a run makes under its lease is one ``round_write_statement``: data-modifying CTEs
that all depend on the first one (the lease check, or the mission's own update, which holds
only while ``lease_owner`` is this worker), so it is all or nothing and one round trip. Its
parts, by shape:

* the mission: ``check`` (the lease is still ours), ``finish`` (next run, status, last error;
  the lease released) or ``release`` (the lease released, the schedule as it was);
* the iteration row: the checkpoint columns (message log, rounds, tokens, reminders) and, for
  an end (``finish`` / ``release``), its status, stop reason, error and ``finished_at``;
* new ``tool_invocations`` rows, inserted unless a row of the same iteration, attempt, round
  and position exists; stored rows brought up to date (journaled writes);
* ``compacted_turns`` rows, unless that compaction index is stored;
* a parked run's approval request (``approval_requests``), unless its call has one; and, when a
  finish moves a mission past a run parked for approval (its deadline passed), that run ended
  and its pending request expired.

Running the same statement twice stores the same thing once: a statement whose connection
broke after it committed can be run again without duplicating rows (``retry_transient``). The
result row says whether the lease held (``owned``), whether an end already stored by this
worker's attempt was found (``stored``: a repeated finish), and the ids of the calls' rows as
``[[round, position, id], ...]`` (``calls``).

Rows travel as JSONB arrays unpacked with ``jsonb_to_recordset``; JSON null reads as SQL NULL.
The planner costs ``jsonb_to_recordset`` at 100 rows whatever it holds, so every stored row is
reached by key (a correlated lookup per given call, ``id = ANY(ARRAY(...))`` for stored ones),
never by a join it could answer by reading all of ``tool_invocations``
(``tests/integration/test_round_write_plans.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    Interval,
    Text,
    and_,
    any_,
    bindparam,
    case,
    column,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from worker.store.claim import claim_limit, claim_select
from worker.store.tables import (
    approval_requests,
    compacted_turns,
    mission_iterations,
    missions,
    tool_invocations,
)

__all__ = [
    "APPROVAL_KEYS",
    "ARCHIVE_KEYS",
    "NEW_CALL_KEYS",
    "OUTCOME_KEYS",
    "MissionWrite",
    "recordset",
    "round_write_statement",
]

MissionWrite = Literal["check", "finish", "release"]
"""What the statement does to the mission row (see the module docstring)."""

OUTCOME_KEYS = (
    "result",
    "error",
    "outcome",
    "policy_decision",
    "policy_mode",
    "duration_ms",
)
"""The keys (besides ``id`` and ``attempt``) of each object in ``p_known_calls``: a stored
row's outcome. ``attempt`` replaces the row's only while it is ``parked``: a parked call that
runs after its approval belongs to the attempt that started it, not to the one that parked
it (a started call stays its starter's, whoever settles it)."""

NEW_CALL_KEYS = (
    "iteration_id",
    "mission_id",
    "user_id",
    "round",
    "position",
    "call_id",
    "tool",
    "arguments",
    "idempotency_key",
    "attempt",
    *OUTCOME_KEYS,
)
"""The keys of each object in ``p_new_calls``: the columns of a new ``tool_invocations`` row."""

ARCHIVE_KEYS = (
    "iteration_id",
    "mission_id",
    "attempt",
    "compaction_index",
    "round",
    "start_index",
    "folded",
    "folded_turns",
    "summary",
    "tokens_before",
    "tokens_after",
    "model",
    "duration_ms",
    "error",
)
"""The keys of each object in ``p_archive``: the columns of a ``compacted_turns`` row."""

APPROVAL_KEYS = (
    "consumer",
    "user_id",
    "agent_id",
    "mission_id",
    "iteration_id",
    "attempt",
    "round",
    "position",
    "call_id",
    "tool",
    "arguments",
    "arguments_hash",
    "reply_text",
    "reason",
)
"""The columns of a new ``approval_requests`` row bound as ``p_<key>`` (with ``p_ttl``)."""

DEADLINE_NOTE = "the run ended: the mission's deadline passed while it waited for this approval"
"""The ``decision_note`` of a pending request whose parked run a finish ended."""


def recordset(table: Any, keys: Sequence[str], param: str) -> Any:
    """The JSONB array bound to ``param`` (objects with ``keys``, columns of ``table``) as a
    derived table: ``jsonb_to_recordset(:param) AS param(key type, ...)``."""
    columns = [column(key, table.c[key].type) for key in keys]
    return (
        func.jsonb_to_recordset(bindparam(param, type_=JSONB))
        .table_valued(*columns)
        .render_derived(name=param, with_types=True)
    )


@functools.cache
def round_write_statement(
    mission_write: MissionWrite,
    *,
    iteration: bool,
    checkpoint: bool,
    end: bool,
    new_calls: bool,
    known_calls: bool,
    archive: bool,
    reserve: bool = False,
    approval: bool = False,
    end_parked: bool = False,
    claim: int = 0,
) -> Any:
    """The statement for one shape (which parts it writes), built once per shape.

    Args:
        mission_write: what happens to the mission row (``MissionWrite``).
        iteration: the iteration row is written (``p_iteration_id``); without it only the
            mission is (a skipped run).
        checkpoint: the checkpoint columns are written (``p_messages``, ``p_reminders``,
            ``p_rounds``, ``p_prompt_tokens``, ``p_completion_tokens``).
        end: the run ends here (``p_status``, ``p_stop_reason``, ``p_error``, and
            ``finished_at = now()``); a repeat by the same attempt reads as ``stored``
            (``p_attempt``).
        new_calls, known_calls, archive: ``p_new_calls`` (``NEW_CALL_KEYS``),
            ``p_known_calls`` (``id`` and ``OUTCOME_KEYS``) and ``p_archive``
            (``ARCHIVE_KEYS``) are written.
        reserve: a rate-limit slot is reserved first, with ``mana_ai_reserve_tool_call``
            (``p_user_id``, ``p_tool``, ``p_consumer``, ``p_window``, ``p_limit``), and the new
            rows whose outcome is ``started`` are inserted (stored rows updated to it) only
            when it was taken or ``p_run_anyway`` (log-only runs a refused call too): the
            policy gate's reservation and a write's start in one round trip.
        approval: the parked call's approval request is inserted (``p_`` + ``APPROVAL_KEYS``,
            ``p_ttl``), unless the iteration's call at that round and position has one.
        end_parked: the mission's runs parked for approval end as ``failed`` /
            ``deadline_passed`` and their pending requests expire (a finish that moves the
            mission past them).
        claim: other due missions are claimed too, up to this many (0: none;
            ``worker.store.claim.claim_select`` with ``after_finish``, its limit written as
            ``claim_limit`` says; its ``claim_parameters``), whether or not the lease held: the
            worker's next missions, in the round trip of this one's end.

    Always bound: ``p_mission_id``, ``p_worker_id``; with ``finish``: ``p_next_run_at``,
    ``p_mission_status``, ``p_last_error``. A paused mission stays paused.

    Returns:
        A SELECT of one row: ``owned`` (1 when the lease held and everything was written,
        else 0 and nothing was), ``stored`` (an end this attempt already stored; only with
        ``end``), ``calls`` (``[[round, position, id], ...]`` of the new calls' rows, those
        inserted now and those a repeat found; only with ``new_calls``), with ``reserve``
        the reservation: ``reserved``, ``checked_at``, ``recent``, and with ``approval`` the
        request: ``approval_id``, ``approval_created``, ``approval_expires_at`` (NULL when the
        lease did not hold). With ``claim``, one such row per claimed mission, each with the
        claim's columns (``worker.store.claim.claimed_mission`` reads them), or one row whose
        claim columns are NULL when none was claimed.
    """
    mission_id = bindparam("p_mission_id", type_=BigInteger)
    worker_id = bindparam("p_worker_id", type_=Text)
    ours = and_(missions.c.id == mission_id, missions.c.lease_owner == worker_id)
    owner: Any
    if mission_write == "check":
        owner = select(missions.c.id).where(ours).cte("owned")
    elif mission_write == "finish":
        owner = (
            update(missions)
            .where(ours)
            .values(
                next_run_at=bindparam("p_next_run_at", type_=DateTime(timezone=True)),
                status=case(
                    (missions.c.status == "paused", "paused"),
                    else_=bindparam("p_mission_status", type_=Text),
                ),
                last_error=bindparam("p_last_error", type_=Text),
                lease_owner=None,
                lease_expires_at=None,
                updated_at=func.now(),
            )
            .returning(missions.c.id)
            .cte("owned")
        )
    else:
        owner = (
            update(missions)
            .where(ours)
            .values(lease_owner=None, lease_expires_at=None, updated_at=func.now())
            .returning(missions.c.id)
            .cte("owned")
        )
    owned = select(owner.c.id).exists()
    columns: list[Any] = [select(func.count()).select_from(owner).scalar_subquery().label("owned")]
    writes: list[Any] = []  # CTEs, in the order they are written

    def write(stmt: Any) -> Any:
        writes.append(stmt.cte(f"write_{len(writes)}"))
        return writes[-1]

    its = mission_iterations
    iteration_id = bindparam("p_iteration_id", type_=BigInteger)
    if iteration:
        values: dict[str, Any] = {}
        if checkpoint:
            values |= {
                "messages": bindparam("p_messages", type_=JSONB),
                "reminders": bindparam("p_reminders", type_=JSONB),
                "rounds": bindparam("p_rounds", type_=Integer),
                "prompt_tokens": bindparam("p_prompt_tokens", type_=BigInteger),
                "completion_tokens": bindparam("p_completion_tokens", type_=BigInteger),
            }
        if end:
            values |= {
                "status": bindparam("p_status", type_=Text),
                "stop_reason": bindparam("p_stop_reason", type_=Text),
                "error": bindparam("p_error", type_=Text),
                "finished_at": func.now(),
            }
            repeated = exists().where(
                its.c.id == iteration_id,
                its.c.attempt == bindparam("p_attempt", type_=Integer),
                its.c.worker_id == worker_id,
                its.c.status == bindparam("p_status", type_=Text),
                its.c.finished_at.is_not(None),
            )
            columns.append(repeated.label("stored"))
        if values:
            write(
                update(its)
                .where(its.c.id == iteration_id, owned)
                .values(values)
                .returning(its.c.id)
            )
    reservation: Any = None
    if reserve:
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
        columns += [
            select(reservation.c.reserved).scalar_subquery().label("reserved"),
            select(reservation.c.checked_at).scalar_subquery().label("checked_at"),
            select(reservation.c.recent).scalar_subquery().label("recent"),
        ]
    may_start = None
    if reservation is not None:
        may_start = or_(
            select(reservation.c.reserved).scalar_subquery(),
            bindparam("p_run_anyway", type_=Boolean),
        )
    if iteration and new_calls:
        columns.append(_new_calls(write, owned, may_start).label("calls"))
    if iteration and known_calls:
        data = recordset(tool_invocations, ("id", "attempt", *OUTCOME_KEYS), "p_known_calls")
        ids = recordset(tool_invocations, ("id",), "p_known_calls")
        conditions = [
            tool_invocations.c.id == data.c.id,
            # the rows by primary key: joined to the recordset alone, the planner (which costs
            # jsonb_to_recordset at 100 rows) read the whole table for a few rows
            tool_invocations.c.id == any_(func.array(select(ids.c.id).scalar_subquery())),
            owned,
        ]
        if may_start is not None:  # a stored row (a parked call) becomes started only so
            conditions.append(or_(data.c.outcome != "started", may_start))
        starter = case(
            (tool_invocations.c.outcome == "parked", data.c.attempt),
            else_=tool_invocations.c.attempt,
        )
        write(
            update(tool_invocations)
            .where(*conditions)
            .values({"attempt": starter, **{k: data.c[k] for k in OUTCOME_KEYS}})
            .returning(tool_invocations.c.id)
        )
    if iteration and archive:
        data = recordset(compacted_turns, ARCHIVE_KEYS, "p_archive")
        write(
            pg_insert(compacted_turns)
            .from_select(ARCHIVE_KEYS, select(*(data.c[k] for k in ARCHIVE_KEYS)).where(owned))
            .on_conflict_do_nothing(index_elements=["iteration_id", "compaction_index"])
            .returning(compacted_turns.c.id)
        )
    if iteration and approval:
        columns += _approval_request(write, owned)
    if end_parked:
        _end_parked(write, owned, mission_id)
    ctes = [owner, *writes] if reservation is None else [reservation, owner, *writes]
    if not claim:
        return select(*columns).add_cte(*ctes)
    # one row per claimed mission (one with NULLs when none was), each with the columns above
    claims = claim_select(
        after_finish=True, finished_tokens=iteration and checkpoint, limit=claim_limit(claim)
    )
    claims = claims.subquery("claims")
    one = select(literal_column("1").label("one")).subquery("one")
    return (
        select(*columns, *claims.c)
        .select_from(one.outerjoin(claims, literal_column("true")))
        .add_cte(*ctes)
    )


def _approval_request(write: Callable[[Any], Any], owned: Any) -> list[Any]:
    """``write`` the insert of the parked call's approval request (none when its call has one:
    a call is asked about once); the columns ``approval_id``, ``approval_created``,
    ``approval_expires_at`` of the request inserted now or found (found also when the lease
    no longer holds: a repeat of a park that committed reads its request). Created: inserted
    now, or found from the same attempt (a repeat after a lost answer: its first run inserted
    it and nobody learnt it), never one of an earlier attempt at the same park."""
    requests = approval_requests
    values: dict[str, Any] = {
        key: bindparam(f"p_{key}", type_=requests.c[key].type) for key in APPROVAL_KEYS
    }
    values["expires_at"] = func.now() + bindparam("p_ttl", type_=Interval)
    inserted = write(
        pg_insert(requests)
        .from_select(list(values), select(*values.values()).where(owned))
        .on_conflict_do_nothing(
            index_elements=["iteration_id", "round", "position"],
            # a literal: the partial index is inferred from the predicate's text, and a bound
            # parameter stops matching once the prepared statement goes generic
            index_where=text("consumer = 'mission'"),
        )
        .returning(requests.c.id, requests.c.expires_at)
    )
    found = (
        select(requests.c.id, requests.c.expires_at, requests.c.attempt)
        .where(
            requests.c.consumer == "mission",
            requests.c.iteration_id == values["iteration_id"],
            requests.c.round == values["round"],
            requests.c.position == values["position"],
        )
        .subquery("found_request")
    )
    return [
        func.coalesce(
            select(inserted.c.id).scalar_subquery(), select(found.c.id).scalar_subquery()
        ).label("approval_id"),
        # created by this attempt: now, or by this same park before, whose answer was lost
        # (nobody was told of it: its repeat tells)
        or_(
            select(inserted.c.id).exists(),
            select(found.c.id).where(found.c.attempt == values["attempt"]).exists(),
        ).label("approval_created"),
        func.coalesce(
            select(inserted.c.expires_at).scalar_subquery(),
            select(found.c.expires_at).scalar_subquery(),
        ).label("approval_expires_at"),
    ]


def _end_parked(write: Callable[[Any], Any], owned: Any, mission_id: Any) -> None:
    """``write`` the end of the mission's runs parked for approval (``failed`` /
    ``deadline_passed``) and the expiry of their pending requests."""
    its = mission_iterations
    write(
        update(its)
        .where(its.c.mission_id == mission_id, its.c.status == "awaiting_approval", owned)
        .values(
            status="failed",
            stop_reason="deadline_passed",
            error="the mission's deadline passed while the run waited for an approval",
            finished_at=func.now(),
        )
        .returning(its.c.id)
    )
    requests = approval_requests
    write(
        update(requests)
        .where(
            requests.c.mission_id == mission_id,
            requests.c.consumer == "mission",
            requests.c.status == "pending",
            owned,
        )
        .values(status="expired", decided_at=func.now(), decision_note=DEADLINE_NOTE)
        .returning(requests.c.id)
    )


def _new_calls(write: Callable[[Any], Any], owned: Any, may_start: Any = None) -> Any:
    """``write`` the insert of ``p_new_calls`` (rows that exist already are left alone; a
    ``started`` row only when ``may_start`` holds, if given); return the scalar subquery of
    ``[[round, position, id], ...]`` of the new calls' rows, inserted or found.

    Each given row looks for its stored namesake (same iteration, attempt, round, position)
    with a correlated subquery, once (the CTE ``given_calls``): PostgreSQL runs it per row on
    ``ix_tool_invocations_iteration_id``. Written as a join (``NOT EXISTS``), the planner
    costs ``jsonb_to_recordset`` at its default 100 rows and hashes the whole table instead,
    a sequential scan of ``tool_invocations`` per statement until the table outgrows that
    estimate (tens of thousands of rows).
    """
    calls = tool_invocations
    data = recordset(calls, NEW_CALL_KEYS, "p_new_calls")
    stored_id = (
        select(calls.c.id)
        .where(
            calls.c.iteration_id == data.c.iteration_id,
            calls.c.attempt == data.c.attempt,
            calls.c.round == data.c.round,
            calls.c.position == data.c.position,
        )
        .limit(1)
        .scalar_subquery()
    )
    given = select(*(data.c[k] for k in NEW_CALL_KEYS), stored_id.label("stored_id")).cte(
        "given_calls"
    )
    conditions = [owned, given.c.stored_id.is_(None)]
    if may_start is not None:
        conditions.append(or_(given.c.outcome != "started", may_start))
    inserted = (
        insert(calls)
        .from_select(
            NEW_CALL_KEYS,
            # Rows are numbered in source order: a hash anti-join (PostgreSQL 16+) would
            # otherwise hand them to the insert in hash order.
            select(*(given.c[k] for k in NEW_CALL_KEYS))
            .where(*conditions)
            .order_by(given.c.round, given.c.position),
        )
        .returning(calls.c.round, calls.c.position, calls.c.id)
    )
    inserted = write(inserted)
    found = select(given.c.round, given.c.position, given.c.stored_id).where(
        given.c.stored_id.is_not(None), owned
    )
    both = union_all(select(inserted.c.round, inserted.c.position, inserted.c.id), found).subquery(
        "call_ids"
    )
    triple = func.jsonb_build_array(both.c.round, both.c.position, both.c.id)
    return (
        select(func.coalesce(func.jsonb_agg(triple), literal_column("'[]'::jsonb", JSONB)))
        .select_from(both)
        .scalar_subquery()
    )
