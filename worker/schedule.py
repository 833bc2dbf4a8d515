"""Mission schedules: 5-field cron in an IANA timezone, or one-shot.

Cron math is APScheduler 3's ``CronTrigger`` (DST-aware). One translation is ours: standard cron
(POSIX ``crontab(5)``) numbers the day of week 0-7 with 0 and 7 = Sunday, while APScheduler 3's
``from_crontab`` passes the field through to its own numbering (0 = Monday). We rewrite the
day-of-week field to day names, which both agree on, so ``0 9 * * 1`` means Monday as users expect.

Known difference left as is: when both day-of-month and day-of-week are restricted, cron fires
when *either* matches, APScheduler when *both* do.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from worker.errors import ManaAIError

__all__ = ["ScheduleError", "cron_trigger", "next_run_after", "parse_timezone"]

_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


class ScheduleError(ManaAIError):
    """A cron expression or timezone is invalid; the message names the offending value."""


def parse_timezone(name: str) -> ZoneInfo:
    """The IANA timezone ``name`` (e.g. ``Europe/Berlin``). Raises ScheduleError if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name like 'Europe/Berlin'"
        ) from exc


def _expand_day_of_week(field: str) -> str:
    """Rewrite a cron day-of-week field (0-7, Sunday = 0 or 7) as APScheduler day names."""
    if field in ("*", "?"):
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"step must be >= 1 in {part!r}")
        if base == "*":
            lo, hi = 0, 6
        elif "-" in base:
            lo_text, hi_text = base.split("-", 1)
            lo, hi = _day_number(lo_text), _day_number(hi_text)
        else:
            lo = _day_number(base)
            hi = 6 if step_text else lo
        if hi == 0 and lo > 0:  # "5-0" / "5-7": through Sunday
            hi = 7
        if lo > hi:
            raise ValueError(f"range {base!r} runs backwards")
        days.update(d % 7 for d in range(lo, hi + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))


def _day_number(text: str) -> int:
    lowered = text.strip().lower()
    if lowered[:3] in _DAY_NAMES and lowered.isalpha():
        return _DAY_NAMES.index(lowered[:3])
    value = int(lowered)
    if not 0 <= value <= 7:
        raise ValueError(f"day of week {text!r} is outside 0-7")
    return 7 if value == 7 else value


def cron_trigger(expr: str, timezone: str) -> CronTrigger:
    """A CronTrigger for a standard 5-field cron expression in IANA ``timezone``.

    Raises:
        ScheduleError: the expression does not have 5 fields, a field is out of range, or the
            timezone is unknown. The message quotes the expression.
    """
    tz = parse_timezone(timezone)
    fields = expr.split()
    if len(fields) != 5:
        raise ScheduleError(
            f"invalid cron expression {expr!r}: expected 5 fields "
            f"(minute hour day-of-month month day-of-week), got {len(fields)}"
        )
    minute, hour, day, month, day_of_week = fields
    try:
        return CronTrigger(
            second=0,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=_expand_day_of_week(day_of_week),
            timezone=tz,
        )
    except ValueError as exc:
        raise ScheduleError(f"invalid cron expression {expr!r}: {exc}") from exc


def next_run_after(expr: str, timezone: str, after: datetime) -> datetime | None:
    """The first fire time of ``expr`` strictly after ``after`` (timezone-aware), or ``None``.

    Missed runs coalesce: the caller passes *now*, not the missed time, so a mission that was
    due several times while the daemon was down runs once and is then scheduled in the future.

    Raises:
        ScheduleError: see ``cron_trigger``.
        ValueError: ``after`` is naive.
    """
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    trigger = cron_trigger(expr, timezone)
    fire_time: datetime | None = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
    return fire_time
