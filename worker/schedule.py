"""Mission schedules: 5-field cron in an IANA timezone, or one-shot.

Three layers, each with its own source of truth:

1. **Syntax** is POSIX / Vixie cron's (``crontab(5)``): each field is a comma-separated list of
   ``*``, ``N``, ``N-M``, each optionally ``/STEP``; ``N/STEP`` means ``N-max/STEP`` (as in
   cronie). Month and day-of-week accept their three-letter English names (``jan``-``dec``,
   ``sun``-``sat``, any case) and nothing longer or shorter; day-of-week numbers are 0-7 with
   0 and 7 = Sunday, and a range may end on Sunday (``fri-sun``, ``5-0``). Anything else
   (``monkey``, ``L``, ``#``, ``?``, ``last``) is refused with a ScheduleError that names the
   field. This layer is ours: it is what mana-ai promises (``docs/explanation/daemon.md``,
   "Schedules"), and cronsim accepts more (``L``, ``W``, ``#``, a seconds field) and says
   less (``Bad day-of-week``).
2. **Wall-clock math** (which local date-times match) is PyPI ``cronsim``'s, which follows
   Debian cron, run on wall-clock time labelled UTC (cronsim then sees no DST at all). That
   includes ``crontab(5)``'s day rule: when both day-of-month and day-of-week are restricted
   (neither starts with ``*``), a day matches when *either* does (``0 9 1 * mon``: the 1st of
   each month and every Monday).
3. **Mapping wall-clock times to instants across DST** is ours, and follows cronie's rule
   (``cron(8)``, "Daylight Saving Time and other time changes"; the job classes are cronie's
   ``MIN_STAR`` / ``HR_STAR`` flags):

   * a *fixed-time* job (neither the minute nor the hour field starts with ``*``, e.g.
     ``30 2 * * *``) runs once per matching local time: in the repeated hour of an autumn
     change only the first occurrence runs; a local time skipped by a spring change runs once,
     at the first instant after the gap (several skipped times collapse into that one run);
   * an *interval* job (the minute or hour field starts with ``*``, e.g. ``30 * * * *`` or
     ``*/15 * * * *``) runs on real time: both occurrences of a repeated local time run (they
     are an hour apart), skipped local times do not exist and are not made up.

   cronsim has this rule too (given a zone-aware start), and agrees with it for fixed-time
   jobs, but not for interval jobs on a day whose change skips local midnight (America/
   Santiago, America/Havana) or moves the clock by 30 minutes (Australia/Lord_Howe): it steps
   from a local midnight or full hour that does not exist and lands past real local times
   that do. ``*/15 1 * * 0`` in Santiago after 2026-09-05 12:00 runs at 01:00 on Sunday
   2026-09-06 (the day begins at 01:00), and cronsim says 2026-09-13; ``*/15 1 6 9 *`` it
   puts a year later; ``*/20 3 * * *`` in Lord Howe on 2026-10-04 runs at 03:00, cronsim
   says 03:40 (cronsim 2.8; ``tests/unit/test_schedule_dst.py`` pins these). So cronsim gets
   no timezone here, only wall-clock times.

   APScheduler's own DST handling is not used either: for ``30 2 * * *`` in Europe/Berlin it
   fires at both 02:30 on 2026-10-25 and then keeps returning the second one (the next run
   would never move forward), and on 2026-03-29 it fires at a local time that does not exist.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from worker.errors import ManaAIError

__all__ = [
    "CronSchedule",
    "ScheduleError",
    "cron_schedule",
    "in_zone",
    "next_run_after",
    "parse_timezone",
]


def in_zone(value: object, zone: object) -> datetime | None:
    """``value`` (an aware datetime: a mission's next run) in the IANA zone ``zone`` (its
    schedule's); ``None`` when there is no time, no zone, the zone is UTC or unknown (nothing
    to add to the UTC time)."""
    if not isinstance(value, datetime) or not isinstance(zone, str) or zone in ("", "UTC"):
        return None
    try:
        return value.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return None


_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")

_MAX_DST_SHIFT = timedelta(hours=3)
"""Largest clock change treated as a DST change; cron(8) calls larger ones clock corrections.
It bounds how far apart a local time and its instant(s) can move, so it sizes the search window
around an instant."""

_TICK = timedelta(microseconds=1)

_PROBE = datetime(2000, 1, 1, tzinfo=UTC)
"""Any start: cronsim checks an expression when it is built, before it looks at the start."""


class ScheduleError(ManaAIError):
    """A cron expression or timezone is invalid; the message names the offending value."""


def parse_timezone(name: str) -> ZoneInfo:
    """The IANA timezone ``name`` (e.g. ``Europe/Berlin``). Raises ScheduleError if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a name too long
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name like 'Europe/Berlin'"
        ) from exc


@dataclass(frozen=True)
class _Field:
    name: str
    lo: int
    hi: int
    names: tuple[str, ...] = ()
    name_base: int = 0  # the number of names[0]


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTH_NAMES, 1),
    _Field("day-of-week", 0, 7, _DAY_NAMES, 0),
)


@dataclass(frozen=True)
class CronSchedule:
    """A validated cron expression in a timezone, ready for ``next_after``.

    Build it with ``cron_schedule``. ``fixed_time`` says which DST rule applies (see the module
    docstring). ``cron`` is ``expr`` as cronsim reads it (numbers only, see ``_translate``), or
    ``None`` when no date ever matches (``0 0 30 2 *``).
    """

    expr: str
    zone: ZoneInfo
    fixed_time: bool
    cron: str | None

    def next_after(self, after: datetime) -> datetime | None:
        """The first run strictly after ``after`` (timezone-aware), or ``None`` if none.

        The run is returned in UTC: two aware datetimes that share a ``ZoneInfo`` compare by
        wall-clock time and ignore ``fold``, so the two 02:30 of an autumn change would look
        equal in the zone itself.

        Raises:
            ValueError: ``after`` is naive.
        """
        if after.tzinfo is None:
            raise ValueError("after must be timezone-aware")
        after = after.astimezone(UTC)
        quick = self._next_without_transition(after)
        if quick is not None:
            return quick
        best: datetime | None = None
        for wall in self._walls_after(_wall_clock(after, self.zone) - _MAX_DST_SHIFT - _TICK):
            if best is not None and wall > _wall_clock(best, self.zone) + _MAX_DST_SHIFT:
                break  # no later local time can map to an earlier instant
            for instant in self._instants(wall):
                if instant > after and (best is None or instant < best):
                    best = instant
        return best

    def _walls_after(self, wall: datetime) -> Iterator[datetime]:
        """The matching local wall-clock times strictly after ``wall`` (both labelled UTC), in
        order; cronsim's, which stops after 50 years without a match."""
        if self.cron is None:
            return iter(())
        return CronSim(self.cron, wall)

    def _next_without_transition(self, after: datetime) -> datetime | None:
        """The answer when no clock change is near ``after`` or the candidate, else ``None``.

        Far from any change a local time has exactly one instant, so the first matching local
        time after ``after``'s is the answer. This skips the windowed search for the common
        case (an every-minute job would otherwise scan a few hundred local times).
        """
        offset = after.astimezone(self.zone).utcoffset()
        wall = next(self._walls_after(_wall_clock(after, self.zone)), None)
        if wall is None:
            return None
        candidate = wall.replace(tzinfo=None) - (offset or timedelta(0))
        candidate = candidate.replace(tzinfo=UTC)
        probes = (
            after - _MAX_DST_SHIFT,
            after + _MAX_DST_SHIFT,
            candidate - _MAX_DST_SHIFT,
            candidate,
            candidate + _MAX_DST_SHIFT,
        )
        if any(p.astimezone(self.zone).utcoffset() != offset for p in probes):
            return None
        return candidate

    def _instants(self, wall: datetime) -> list[datetime]:
        """The UTC instants at which local time ``wall`` runs, per the DST rule."""
        naive = wall.replace(tzinfo=None)
        first = naive.replace(tzinfo=self.zone, fold=0)
        second = naive.replace(tzinfo=self.zone, fold=1)
        first_utc, second_utc = first.astimezone(UTC), second.astimezone(UTC)
        exists = first_utc.astimezone(self.zone).replace(tzinfo=None) == naive
        if not exists:  # skipped by a spring change
            if not self.fixed_time:
                return []
            return [_gap_end(min(first_utc, second_utc), max(first_utc, second_utc), self.zone)]
        if first_utc == second_utc or self.fixed_time:
            return [first_utc]
        return [first_utc, second_utc]  # repeated by an autumn change: both, an hour apart


def _wall_clock(instant: datetime, zone: ZoneInfo) -> datetime:
    """``instant``'s local wall-clock time in ``zone``, labelled UTC (what cronsim is given)."""
    return instant.astimezone(zone).replace(tzinfo=UTC)


def _gap_end(lo: datetime, hi: datetime, zone: ZoneInfo) -> datetime:
    """The first instant after the clock change in ``[lo, hi]`` (UTC): the end of the gap.

    ``lo`` has the offset before the change and ``hi`` the offset after it; bisection to the
    second (time-zone data has whole-second transitions).
    """
    before = lo.astimezone(zone).utcoffset()
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if (lo + timedelta(seconds=mid)).astimezone(zone).utcoffset() == before:
            lo_s = mid
        else:
            hi_s = mid
    return lo + timedelta(seconds=hi_s)


@functools.lru_cache(maxsize=4096)
def cron_schedule(expr: str, timezone: str) -> CronSchedule:
    """Validate ``expr`` (standard 5-field cron) and ``timezone`` (IANA). Cached (a
    CronSchedule is immutable): every run of a mission computes its next run.

    An expression no date matches (``0 0 30 2 *``: both day fields joined by AND, and no
    selected month has that day) is valid, and its ``next_after`` is always ``None``: callers
    that accept a schedule say so (``missions add`` refuses it).

    Raises:
        ScheduleError: not 5 fields, a field that is not cron syntax (see the module
            docstring) or out of range, or an unknown timezone. The message quotes the
            expression and names the field.
    """
    zone = parse_timezone(timezone)
    fields = expr.split()
    if len(fields) != 5:
        raise ScheduleError(
            f"invalid cron expression {expr!r}: expected 5 fields "
            f"(minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    try:
        cron = " ".join(_translate(text, spec) for text, spec in zip(fields, _FIELDS, strict=True))
    except ValueError as exc:
        raise ScheduleError(f"invalid cron expression {expr!r}: {exc}") from exc
    try:
        CronSim(cron, _PROBE)
    except CronSimError:
        # What cronsim refuses beyond our syntax check: a day-of-month that none of the
        # selected months has, when both day fields must match ("Bad day-of-month").
        matches: str | None = None
    else:
        matches = cron
    fixed_time = not (fields[0].startswith("*") or fields[1].startswith("*"))
    return CronSchedule(expr=expr, zone=zone, fixed_time=fixed_time, cron=matches)


def _translate(text: str, spec: _Field) -> str:
    """One cron field as cronsim reads it: its values as numbers, after a leading ``*`` or
    ``*/S`` element kept as written. Cron (and cronsim) tell the job class and the day rule by
    whether a field starts with ``*``, and cronsim reads those two forms as ``_expand`` does;
    every other element is passed as numbers, so that names, Sunday as 7 and ranges that end
    on Sunday (``fri-sun``, which cronsim refuses) mean what the module docstring says.

    Raises ValueError with a message naming the field and the offending part.
    """
    parts = text.split(",")
    values = [_expand(part, spec) for part in parts]  # checks every element
    if text.startswith("*"):
        rest = sorted(set().union(*values[1:]))
        return ",".join([parts[0], *map(str, rest)])
    return ",".join(map(str, sorted(set().union(*values))))


def _expand(part: str, spec: _Field) -> range:
    """The values of one list element: ``*``, ``N``, ``N-M``, each with an optional ``/S``."""
    base, slash, step_text = part.partition("/")
    step = 1
    if slash:
        if not (step_text.isascii() and step_text.isdigit()) or int(step_text) < 1:
            raise ValueError(f"{spec.name} step {step_text!r} in {part!r} is not a number >= 1")
        step = int(step_text)
    if base == "*":
        lo, hi = spec.lo, spec.hi
    elif "-" in base:
        lo_text, _, hi_text = base.partition("-")
        lo, hi = _value(lo_text, spec, part), _value(hi_text, spec, part)
        if spec.name == "day-of-week" and hi == 0 and lo > 0:  # "fri-sun" / "5-0": to Sunday
            hi = 7
        if lo > hi:
            raise ValueError(f"{spec.name} range {base!r} runs backwards")
    else:
        lo = _value(base, spec, part)
        hi = spec.hi if slash else lo
    return range(lo, hi + 1, step)


def _value(text: str, spec: _Field, part: str) -> int:
    """A number in the field's range, or (month, day-of-week) a whole three-letter name."""
    lowered = text.lower()
    if lowered in spec.names:
        return spec.names.index(lowered) + spec.name_base
    if not (text.isascii() and text.isdigit()):
        names = f" or a name ({', '.join(spec.names)})" if spec.names else ""
        raise ValueError(f"{spec.name} {text!r} in {part!r} is not a number{names}")
    value = int(text)
    if not spec.lo <= value <= spec.hi:
        raise ValueError(f"{spec.name} {text!r} is outside {spec.lo}-{spec.hi}")
    return value


def next_run_after(expr: str, timezone: str, after: datetime) -> datetime | None:
    """The first run of ``expr`` in ``timezone`` strictly after ``after`` (in UTC), or ``None``.

    Missed runs coalesce: the caller passes *now*, not the missed time, so a mission that was
    due several times while the daemon was down runs once and is then scheduled in the future.
    DST changes follow the rule in the module docstring.

    Raises:
        ScheduleError: see ``cron_schedule``.
        ValueError: ``after`` is naive.
    """
    if after.tzinfo is not None:
        # Runs fall on whole minutes of the wall clock, so the first run after the minute that
        # holds ``after`` is the answer whenever it lies past ``after`` (no run can fall
        # between them); that answer is the same for every ``after`` of that minute, and of
        # every mission on the same schedule: cached.
        minute = after.astimezone(UTC).replace(second=0, microsecond=0)
        first = _first_run_after_minute(expr, timezone, minute)
        if first is None or first > after:
            return first
    return cron_schedule(expr, timezone).next_after(after)


@functools.lru_cache(maxsize=4096)
def _first_run_after_minute(expr: str, timezone: str, minute: datetime) -> datetime | None:
    return cron_schedule(expr, timezone).next_after(minute)
