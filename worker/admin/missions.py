"""Creating missions and changing their course: one set of rules for every way an admin does
it (``mana-ai missions add|pause|resume``, the HTTP API, which also runs one now).

``create_mission`` checks the objective (``worker.names``), the schedule (a cron in its
timezone for a recurring mission, a time in the future or "now" for a one-shot) and the
deadline before anything is written. ``pause_mission``, ``resume_mission`` and ``run_now``
say what they did (``Course``). Messages name the flag or field as the caller gave it
(``Labels``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from worker.errors import ConflictError, UsageError
from worker.names import checked_name, checked_text

if TYPE_CHECKING:
    from worker.queries.missions import AdminStore

__all__ = [
    "Course",
    "MissionRequest",
    "create_mission",
    "pause_mission",
    "resume_mission",
    "run_now",
]

Labels = Callable[[str], str]
"""``field -> how the caller names it`` (``due_now`` -> ``--due-now``)."""


def flag(name: str) -> str:
    """The command line's label of field ``name``: ``--due-now``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class MissionRequest:
    """A new mission, as given: an ``agent`` (name), an ``objective``, and a schedule:
    ``cron`` (5 fields, in ``timezone``, default UTC) for a recurring mission, or ``at`` (a
    time with a UTC offset, in the future) / ``due_now`` for a one-shot; ``due_now`` with
    ``cron`` makes the first run now. No run starts after ``deadline``. ``catch_up`` says what
    becomes of missed runs (``skip`` | ``once`` | ``all``: ``worker.db.statuses.CatchUp``),
    ``catch_up_window`` how far back ``all`` goes (default one day)."""

    agent: str
    objective: str
    cron: str | None = None
    timezone: str | None = None
    at: datetime | None = None
    due_now: bool = False
    deadline: datetime | None = None
    catch_up: str = "once"
    catch_up_window: timedelta | None = None


async def create_mission(
    admin: AdminStore,
    request: MissionRequest,
    labels: Labels = flag,
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Check ``request`` (see the module docstring) and create the mission (due at the
    database's "now" for ``due_now``, so listening workers start it at once).

    Raises:
        UsageError: a missing, contradictory or refused value (nothing is written).
        ScheduleError: the cron does not parse or never fires, or the timezone is unknown.
        NotFoundError: no such agent.
    """
    from worker.schedule import parse_timezone

    agent_name = checked_name(request.agent, labels("agent"))
    objective = checked_text(request.objective, labels("objective"))
    zone = "UTC" if request.timezone is None else request.timezone  # "" is no zone: refused
    timezone = checked_name(zone, labels("timezone"))
    if request.timezone is not None and request.cron is None:
        raise UsageError(
            f"{labels('timezone')} is the time zone of {labels('cron')}: a one-shot mission "
            f"runs at {labels('at')} (which carries its own UTC offset) or now"
        )
    _check_catch_up(request, labels)
    _check_when(request, labels)
    parse_timezone(timezone)
    # the database's clock: the one the claim judges what is due by
    now = now or await admin.database_now()
    first = _first_run(request, timezone, now, labels)
    agent = await admin.agent_by_name(agent_name)
    mission = await admin.add_mission(
        agent_id=agent["id"],
        objective=objective,
        cron=request.cron,
        timezone=timezone,
        next_run_at="now" if request.due_now else first,
        deadline=request.deadline,
        catch_up=request.catch_up,
        catch_up_window=request.catch_up_window,
    )
    return mission | {"agent": agent_name}


def _check_catch_up(request: MissionRequest, labels: Labels) -> None:
    """Raise UsageError for an unknown catch-up policy, or one that does not fit the mission."""
    from worker.db.statuses import CatchUp

    choices = ", ".join(c.value for c in CatchUp)
    if request.catch_up not in {c.value for c in CatchUp}:
        raise UsageError(f"{labels('catch_up')} must be one of {choices}, not {request.catch_up!r}")
    if request.catch_up == CatchUp.ALL and request.cron is None:
        raise UsageError(
            f"{labels('catch_up')} all runs each missed run of a {labels('cron')} mission; a "
            "one-shot mission has one run (skip or once)"
        )
    if request.catch_up_window is not None and request.catch_up != CatchUp.ALL:
        raise UsageError(
            f"{labels('catch_up_window')} is how far back {labels('catch_up')} all runs missed "
            "runs; give it with that policy only"
        )


def _check_when(request: MissionRequest, labels: Labels) -> None:
    """Raise UsageError unless exactly one of cron, at and due_now is given, and the times
    given carry a UTC offset."""
    if request.cron is None and request.at is None and not request.due_now:
        raise UsageError(
            f"give {labels('cron')} for a recurring mission, or {labels('at')} / "
            f"{labels('due_now')} for a one-shot"
        )
    if request.cron is not None and request.at is not None:
        raise UsageError(
            f"{labels('at')} is for one-shot missions; a {labels('cron')} mission runs at its "
            "cron times"
        )
    if request.at is not None and request.due_now:
        raise UsageError(f"give either {labels('at')} or {labels('due_now')}, not both")
    for value, what in ((request.at, "at"), (request.deadline, "deadline")):
        if value is not None and value.tzinfo is None:
            raise UsageError(f"{labels(what)} has no UTC offset; add one, e.g. +00:00")


def _first_run(request: MissionRequest, timezone: str, now: datetime, labels: Labels) -> datetime:
    """The mission's first run (``now`` for due_now, else ``at``, else the cron's next time
    after ``now``). Raises ScheduleError for a cron that never fires, UsageError for an
    ``at`` in the past or a deadline before the first run."""
    from worker.schedule import ScheduleError, next_run_after

    cron_next = None
    if request.cron is not None:
        cron_next = next_run_after(request.cron, timezone, now)  # raises ScheduleError
        if cron_next is None:  # a value refused, like a cron that does not parse
            raise ScheduleError(
                f"cron expression {request.cron!r} never fires (no such date, e.g. 30 February)"
            )
    if request.due_now:
        first = now
    elif request.at is not None:
        if request.at < now:
            raise UsageError(
                f"{labels('at')} {request.at.isoformat()} is in the past; use "
                f"{labels('due_now')} to run at the next tick"
            )
        first = request.at
    else:
        assert cron_next is not None  # one of cron / at / due_now was checked above
        first = cron_next
    if request.deadline is not None and request.deadline < first:
        raise UsageError(
            f"{labels('deadline')} {request.deadline.isoformat()} is before the first run"
        )
    return first


@dataclass(frozen=True)
class Course:
    """What a change of a mission's course did: the ``mission`` after it, whether it
    ``changed`` anything, and a ``note`` that says more (``None``: nothing more to say)."""

    mission: dict[str, Any]
    changed: bool
    note: str | None = None


async def pause_mission(admin: AdminStore, mission_id: int) -> Course:
    """Pause a mission (a running iteration finishes; a run parked for approval keeps
    waiting); one already paused is left as it is.

    Raises:
        NotFoundError: no such mission.
        ConflictError: it is completed.
    """
    current = await admin.get_mission(mission_id)
    if current["status"] == "paused":
        return Course(current, False, "already paused")
    return Course(await admin.pause_mission(mission_id), True)


async def resume_mission(admin: AdminStore, mission_id: int) -> Course:
    """Resume a paused mission: at its next cron time, or where its run parked for an approval
    waits (that run goes on); an active one is left as it is. The note says when its deadline
    has passed (the next claim completes it without a run), and names a run parked for an
    approval (``parked run N``, paused or not: deciding the request is what makes it go on).

    Raises:
        NotFoundError: no such mission.
        ConflictError: it is completed.
    """
    from worker.schedule import next_run_after

    current = await admin.get_mission(mission_id)
    parked = await admin.parked_iteration(mission_id)
    if current["status"] == "active":
        return Course(current, False, f"parked run {parked['id']}" if parked else "already active")
    next_run = None
    if parked is not None:
        next_run = parked["scheduled_for"]
    now = await admin.database_now()  # the clock the claim judges what is due by
    if parked is None and current["cron"] is not None:
        next_run = next_run_after(current["cron"], current["timezone"], now)
    mission = await admin.resume_mission(mission_id, next_run_at=next_run)
    deadline = mission.get("deadline")
    if deadline is not None and deadline <= now:
        return Course(mission, True, "deadline passed")
    if parked is not None:
        return Course(mission, True, f"parked run {parked['id']}")
    return Course(mission, True)


async def run_now(admin: AdminStore, mission_id: int) -> Course:
    """Make an active mission due now (listening workers start it at once, else at the next
    tick); its schedule goes on from that run.

    Raises:
        NotFoundError: no such mission.
        ConflictError: it is paused or completed, a worker runs it now, or its run waits for
            an approval (deciding that makes it go on).
    """
    current = await admin.get_mission(mission_id)
    if current["status"] != "active":
        raise ConflictError(
            f"mission {mission_id} is {current['status']}; only an active mission can run now"
            + (" (resume it first)" if current["status"] == "paused" else "")
        )
    parked = await admin.parked_iteration(mission_id)
    if parked is not None:
        raise ConflictError(
            f"mission {mission_id}'s run {parked['id']} waits for an approval; decide it "
            "(`mana-ai approvals list --status pending`) and the run goes on"
        )
    mission = await admin.run_now(mission_id)
    if mission is None:
        raise ConflictError(f"mission {mission_id} is running now; it cannot be started twice")
    return Course(mission, True)
