"""The parts every write statement of a run is made of (``worker.store.writes``): data-modifying
CTEs that all depend on the first one, the mission's row as this worker's lease leaves it, so
that a statement is all or nothing, in one round trip.

* ``Statement`` collects the CTEs of one statement and its result columns.
* ``lease_check`` / ``lease_released`` / ``schedule_moved``: the mission's row, which the rest
  depends on (the lease still this worker's; and released, or released with the next run).
* ``checkpoint``, ``ended``: the iteration row's progress and its end.
* ``calls``: new ``tool_invocations`` rows inserted (unless stored already) and stored ones
  brought up to date; ``archive``: ``compacted_turns`` rows inserted unless stored.
* ``approval_request``: a parked call's request; ``parked_runs_ended``: the mission's runs
  parked for approval ended, their requests expired (a schedule moved past them).

Rows travel as JSONB arrays unpacked with ``jsonb_to_recordset`` (JSON null reads as SQL
NULL); an empty array writes nothing. The planner costs ``jsonb_to_recordset`` at 100 rows
whatever it holds, so every stored row is reached by key (a correlated lookup per given call,
``id = ANY(ARRAY(...))`` for stored ones), never by a join it could answer by reading all of
``tool_invocations`` (``tests/integration/test_round_write_plans.py``). Constants that name a
partial index's predicate are written as literals, so that a generic plan can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
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
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from worker.db.tables import (
    approval_requests,
    compacted_turns,
    mission_iterations,
    missions,
    tool_invocations,
)

__all__ = [
    "APPROVAL_KEYS",
    "ARCHIVE_KEYS",
    "DEADLINE_NOTE",
    "NEW_CALL_KEYS",
    "OUTCOME_KEYS",
    "Statement",
    "approval_request",
    "archive",
    "calls",
    "checkpoint",
    "constant",
    "ended",
    "lease_check",
    "lease_released",
    "parked_runs_ended",
    "recordset",
    "schedule_moved",
]

OUTCOME_KEYS = ("result", "error", "outcome", "policy_decision", "policy_mode", "duration_ms")
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
    "target",
)
"""The columns of a new ``approval_requests`` row bound as ``p_<key>`` (with ``p_ttl``)."""


def constant(value: str | int | timedelta | None) -> Any:
    """``value`` written into the statement's SQL (``'active'``, ``1``, ``interval '60
    seconds'``, ``NULL``) instead of bound as a parameter. The rule for a statement built once:
    what it would bind is the same on every execution, so it is a constant, and PostgreSQL's
    generic plan of the prepared statement must see it (a partial index's predicate, a
    ``LIMIT``): with ``missions.status = $3`` bound, every claim was planned again
    (``tests/unit/test_statement_constants.py``). Values of a run are bound, as ``p_*``.

    Raises:
        TypeError: ``value`` is of another type (a ``bool`` included).
    """
    if value is None:
        return null()
    if isinstance(value, bool) or not isinstance(value, str | int | timedelta):
        raise TypeError(f"not a SQL constant: {value!r}")
    if isinstance(value, timedelta):
        return literal_column(f"interval '{value.total_seconds():g} seconds'", Interval)
    if isinstance(value, int):
        return literal_column(str(value), Integer)
    quoted = value.replace("'", "''")
    return literal_column(f"'{quoted}'", Text)


DEADLINE_NOTE = "the run ended: the mission's deadline passed while it waited for this approval"
"""The ``decision_note`` of a pending request whose parked run a schedule moved past."""

MISSION_ID = bindparam("p_mission_id", type_=BigInteger)
WORKER_ID = bindparam("p_worker_id", type_=Text)
ITERATION_ID = bindparam("p_iteration_id", type_=BigInteger)


@dataclass
class Statement:
    """One write statement being built: the mission's row CTE (``owner``; the lease held when
    it has a row), the CTEs written after it, and the result columns."""

    owner: Any
    writes: list[Any] = field(default_factory=list)
    columns: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        owned = select(func.count()).select_from(self.owner).scalar_subquery()
        self.columns.insert(0, owned.label("owned"))

    @property
    def owned(self) -> Any:
        """True when this worker's lease held (every write is conditional on it)."""
        return select(self.owner.c.id).exists()

    def write(self, stmt: Any) -> Any:
        """Add ``stmt`` (a data-modifying statement) as the next CTE; that CTE."""
        self.writes.append(stmt.cte(f"write_{len(self.writes)}"))
        return self.writes[-1]

    def select(self, *before: Any) -> Any:
        """The statement: one row of the result columns (``before``: CTEs that come first)."""
        return select(*self.columns).add_cte(*before, self.owner, *self.writes)


def _ours() -> Any:
    return and_(missions.c.id == MISSION_ID, missions.c.lease_owner == WORKER_ID)


def lease_check() -> Statement:
    """A statement whose writes hold while the mission's lease is this worker's."""
    return Statement(select(missions.c.id).where(_ours()).cte("owned"))


def lease_released() -> Statement:
    """A statement that releases the lease (the schedule as it was: the next claim takes the
    same scheduled run over), its writes held to that."""
    owner = (
        update(missions)
        .where(_ours())
        .values(lease_owner=constant(None), lease_expires_at=constant(None), updated_at=func.now())
        .returning(missions.c.id)
        .cte("owned")
    )
    return Statement(owner)


def schedule_moved() -> Statement:
    """A statement that moves the mission to its next run (``p_next_run_at``, the status
    ``p_mission_status`` unless it is paused, ``p_last_error``) and releases the lease."""
    owner = (
        update(missions)
        .where(_ours())
        .values(
            next_run_at=bindparam("p_next_run_at", type_=DateTime(timezone=True)),
            status=case(
                (missions.c.status == literal_column("'paused'"), literal_column("'paused'")),
                else_=bindparam("p_mission_status", type_=Text),
            ),
            last_error=bindparam("p_last_error", type_=Text),
            lease_owner=constant(None),
            lease_expires_at=constant(None),
            updated_at=func.now(),
        )
        .returning(missions.c.id)
        .cte("owned")
    )
    return Statement(owner)


_PROGRESS = {
    "messages": JSONB,
    "reminders": JSONB,
    "rounds": Integer,
    "prompt_tokens": BigInteger,
    "completion_tokens": BigInteger,
}


def _progress() -> dict[str, Any]:
    its = mission_iterations
    return {
        name: func.coalesce(bindparam(f"p_{name}", type_=kind), its.c[name])
        for name, kind in _PROGRESS.items()
    }


def checkpoint(stmt: Statement) -> None:
    """The iteration row's progress: ``p_messages``, ``p_reminders``, ``p_rounds``,
    ``p_prompt_tokens``, ``p_completion_tokens`` (``None``: kept as stored)."""
    its = mission_iterations
    stmt.write(
        update(its)
        .where(its.c.id == ITERATION_ID, stmt.owned)
        .values(_progress())
        .returning(its.c.id)
    )


def ended(stmt: Statement) -> None:
    """The iteration row's end (``p_status``, ``p_stop_reason``, ``p_error``, ``finished_at``)
    with its progress (``checkpoint``'s parameters); the column ``stored``: an end this
    attempt (``p_attempt``) already stored, found by a repeat."""
    its = mission_iterations
    status = bindparam("p_status", type_=Text)
    values = {
        **_progress(),
        "status": status,
        "stop_reason": bindparam("p_stop_reason", type_=Text),
        "error": bindparam("p_error", type_=Text),
        "finished_at": func.now(),
    }
    stmt.write(
        update(its).where(its.c.id == ITERATION_ID, stmt.owned).values(values).returning(its.c.id)
    )
    repeated = exists().where(
        its.c.id == ITERATION_ID,
        its.c.attempt == bindparam("p_attempt", type_=Integer),
        its.c.worker_id == WORKER_ID,
        its.c.status == status,
        its.c.finished_at.is_not(None),
    )
    stmt.columns.append(repeated.label("stored"))


def recordset(table: Any, keys: Sequence[str], param: str) -> Any:
    """The JSONB array bound to ``param`` (objects with ``keys``, columns of ``table``) as a
    derived table: ``jsonb_to_recordset(:param) AS param(key type, ...)``."""
    columns = [column(key, table.c[key].type) for key in keys]
    return (
        func.jsonb_to_recordset(bindparam(param, type_=JSONB))
        .table_valued(*columns)
        .render_derived(name=param, with_types=True)
    )


def calls(stmt: Statement, may_start: Any = None) -> None:
    """The round's calls: ``p_new_calls`` (``NEW_CALL_KEYS``) inserted unless stored already,
    ``p_known_calls`` (``id``, ``attempt`` and ``OUTCOME_KEYS``) brought up to date; a
    ``started`` row only when ``may_start`` holds, if given (a reserved start). The column
    ``calls``: ``[[round, position, id], ...]`` of the new calls' rows, inserted or found."""
    stmt.columns.append(_new_calls(stmt, may_start).label("calls"))
    data = recordset(tool_invocations, ("id", "attempt", *OUTCOME_KEYS), "p_known_calls")
    ids = recordset(tool_invocations, ("id",), "p_known_calls")
    rows = tool_invocations
    conditions = [
        rows.c.id == data.c.id,
        # the rows by primary key: joined to the recordset alone, the planner (which costs
        # jsonb_to_recordset at 100 rows) read the whole table for a few rows
        rows.c.id == any_(func.array(select(ids.c.id).scalar_subquery())),
        stmt.owned,
    ]
    if may_start is not None:  # a stored row (a parked call) becomes started only so
        conditions.append(or_(data.c.outcome != literal_column("'started'"), may_start))
    starter = case(
        (rows.c.outcome == literal_column("'parked'"), data.c.attempt), else_=rows.c.attempt
    )
    stmt.write(
        update(rows)
        .where(*conditions)
        .values({"attempt": starter, **{k: data.c[k] for k in OUTCOME_KEYS}})
        .returning(rows.c.id)
    )


def _new_calls(stmt: Statement, may_start: Any) -> Any:
    """Each given row looks for its stored namesake (same iteration, attempt, round, position)
    with a correlated subquery, once (the CTE ``given_calls``): PostgreSQL runs it per row on
    ``ix_tool_invocations_iteration_id``; written as a join, the planner hashed the whole
    table instead."""
    rows = tool_invocations
    data = recordset(rows, NEW_CALL_KEYS, "p_new_calls")
    stored_id = (
        select(rows.c.id)
        .where(
            rows.c.iteration_id == data.c.iteration_id,
            rows.c.attempt == data.c.attempt,
            rows.c.round == data.c.round,
            rows.c.position == data.c.position,
        )
        .limit(constant(1))
        .scalar_subquery()
    )
    given = select(*(data.c[k] for k in NEW_CALL_KEYS), stored_id.label("stored_id")).cte(
        "given_calls"
    )
    conditions = [stmt.owned, given.c.stored_id.is_(None)]
    if may_start is not None:
        conditions.append(or_(given.c.outcome != literal_column("'started'"), may_start))
    inserted = stmt.write(
        insert(rows)
        .from_select(
            NEW_CALL_KEYS,
            # in source order: a hash anti-join (PostgreSQL 16+) hands rows in hash order
            select(*(given.c[k] for k in NEW_CALL_KEYS))
            .where(*conditions)
            .order_by(given.c.round, given.c.position),
        )
        .returning(rows.c.round, rows.c.position, rows.c.id)
    )
    found = select(given.c.round, given.c.position, given.c.stored_id).where(
        given.c.stored_id.is_not(None), stmt.owned
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


def archive(stmt: Statement) -> None:
    """``p_archive`` (``ARCHIVE_KEYS``): compactions inserted unless that index is stored."""
    data = recordset(compacted_turns, ARCHIVE_KEYS, "p_archive")
    stmt.write(
        pg_insert(compacted_turns)
        .from_select(ARCHIVE_KEYS, select(*(data.c[k] for k in ARCHIVE_KEYS)).where(stmt.owned))
        .on_conflict_do_nothing(index_elements=["iteration_id", "compaction_index"])
        .returning(compacted_turns.c.id)
    )


def approval_request(stmt: Statement) -> None:
    """The parked call's approval request (``p_`` + ``APPROVAL_KEYS``, ``p_ttl``), inserted
    unless its call has one (a call is asked about once); the columns ``approval_id``,
    ``approval_created`` and ``approval_expires_at`` of the request inserted now or found
    (found also when the lease no longer holds: a repeat of a park that committed reads its
    request). Created: inserted now, or by the same attempt before (a repeat after a lost
    answer: nobody learnt of it), never an earlier attempt's."""
    requests = approval_requests
    values: dict[str, Any] = {
        key: bindparam(f"p_{key}", type_=requests.c[key].type) for key in APPROVAL_KEYS
    }
    values["expires_at"] = func.now() + bindparam("p_ttl", type_=Interval)
    inserted = stmt.write(
        pg_insert(requests)
        .from_select(list(values), select(*values.values()).where(stmt.owned))
        .on_conflict_do_nothing(
            index_elements=["iteration_id", "round", "position"],
            index_where=literal_column("consumer = 'mission'"),
        )
        .returning(requests.c.id, requests.c.expires_at)
    )
    found = (
        select(requests.c.id, requests.c.expires_at, requests.c.attempt)
        .where(
            requests.c.consumer == literal_column("'mission'"),
            requests.c.iteration_id == values["iteration_id"],
            requests.c.round == values["round"],
            requests.c.position == values["position"],
        )
        .subquery("found_request")
    )
    stmt.columns += [
        func.coalesce(
            select(inserted.c.id).scalar_subquery(), select(found.c.id).scalar_subquery()
        ).label("approval_id"),
        or_(
            select(inserted.c.id).exists(),
            select(found.c.id).where(found.c.attempt == values["attempt"]).exists(),
        ).label("approval_created"),
        func.coalesce(
            select(inserted.c.expires_at).scalar_subquery(),
            select(found.c.expires_at).scalar_subquery(),
        ).label("approval_expires_at"),
    ]


def parked_runs_ended(stmt: Statement) -> None:
    """The mission's runs parked for approval end as ``failed`` / ``deadline_passed`` and
    their pending requests expire (a schedule moved past them)."""
    its, requests = mission_iterations, approval_requests
    stmt.write(
        update(its)
        .where(
            its.c.mission_id == MISSION_ID,
            its.c.status == literal_column("'awaiting_approval'"),
            stmt.owned,
        )
        .values(
            status=constant("failed"),
            stop_reason=constant("deadline_passed"),
            error=constant("the mission's deadline passed while the run waited for an approval"),
            finished_at=func.now(),
        )
        .returning(its.c.id)
    )
    stmt.write(
        update(requests)
        .where(
            requests.c.mission_id == MISSION_ID,
            requests.c.consumer == literal_column("'mission'"),
            requests.c.status == literal_column("'pending'"),
            stmt.owned,
        )
        .values(
            status=constant("expired"),
            decided_at=func.now(),
            decision_note=constant(DEADLINE_NOTE),
        )
        .returning(requests.c.id)
    )
