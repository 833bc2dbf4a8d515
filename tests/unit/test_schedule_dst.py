"""Cron across DST changes, in both hemispheres: fixed-time jobs run once per local time,
interval jobs once per real hour, skipped times once at the end of the gap, and the next run
always moves forward.

Transitions used (from the IANA data shipped with ``tzdata``):

* Europe/Berlin: 2026-03-29 02:00 CET → 03:00 CEST; 2026-10-25 03:00 CEST → 02:00 CET.
* America/New_York: 2026-03-08 02:00 EST → 03:00 EDT; 2026-11-01 02:00 EDT → 01:00 EST.
* Australia/Sydney (southern): 2026-04-05 03:00 AEDT → 02:00 AEST; 2026-10-04 02:00 → 03:00.
* America/Santiago (southern, at midnight): 2026-04-05 00:00 → 2026-04-04 23:00;
  2026-09-06 00:00 → 01:00.
* America/Havana (at midnight): 2026-03-08 00:00 CST → 01:00 CDT.
* Australia/Lord_Howe (a 30-minute change): 2026-04-05 02:00 → 01:30; 2026-10-04 02:00 → 02:30.
"""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from worker.schedule import cron_schedule, next_run_after


def runs(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """Every run in ``(start, end]``, found as the daemon finds them: each from the last."""
    found: list[datetime] = []
    at = start
    while True:
        nxt = next_run_after(expr, tz, at)
        assert nxt is not None and nxt > at, f"{expr} in {tz}: {nxt} does not move past {at}"
        if nxt > end:
            return found
        found.append(nxt)
        at = nxt


def local(tz: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold)  # type: ignore[misc]


# (zone, expression, transition day, the one run expected that day, local wall time)
FIXED_TIME_CASES = [
    # the example: 02:30 happens twice in Berlin on 2026-10-25; run the first only
    ("Europe/Berlin", "30 2 * * *", date(2026, 10, 25), (2026, 10, 25, 2, 30), 0),
    # 02:30 does not exist in Berlin on 2026-03-29: run at 03:00 CEST, the end of the gap
    ("Europe/Berlin", "30 2 * * *", date(2026, 3, 29), (2026, 3, 29, 3, 0), 0),
    ("America/New_York", "30 1 * * *", date(2026, 11, 1), (2026, 11, 1, 1, 30), 0),
    ("America/New_York", "15 2 * * *", date(2026, 3, 8), (2026, 3, 8, 3, 0), 0),
    ("Australia/Sydney", "30 2 * * *", date(2026, 4, 5), (2026, 4, 5, 2, 30), 0),
    ("Australia/Sydney", "30 2 * * *", date(2026, 10, 4), (2026, 10, 4, 3, 0), 0),
    ("America/Santiago", "30 23 * * *", date(2026, 4, 4), (2026, 4, 4, 23, 30), 0),
    ("America/Santiago", "0 0 * * *", date(2026, 9, 6), (2026, 9, 6, 1, 0), 0),
    ("Australia/Lord_Howe", "45 1 * * *", date(2026, 4, 5), (2026, 4, 5, 1, 45), 0),
    ("Australia/Lord_Howe", "15 2 * * *", date(2026, 10, 4), (2026, 10, 4, 2, 30), 0),
]


@pytest.mark.parametrize(("tz", "expr", "day", "expected", "fold"), FIXED_TIME_CASES)
def test_a_fixed_time_job_runs_once_per_local_day_across_a_change(
    tz: str, expr: str, day: date, expected: tuple[int, ...], fold: int
) -> None:
    zone = ZoneInfo(tz)
    minute = timedelta(minutes=1)  # so that a midnight run on the first day is included
    start = datetime.combine(day - timedelta(days=2), datetime.min.time(), zone) - minute
    end = datetime.combine(day + timedelta(days=3), datetime.min.time(), zone) - minute
    found = runs(expr, tz, start, end)
    days = [r.astimezone(zone).date() for r in found]
    assert days == [day + timedelta(days=d) for d in range(-2, 3)]  # one run on each day
    [on_the_day] = [r for r in found if r.astimezone(zone).date() == day]
    # compared in UTC: datetimes sharing a ZoneInfo compare by wall clock and ignore fold
    assert on_the_day.astimezone(UTC) == local(tz, *expected, fold=fold).astimezone(UTC)


def test_several_times_skipped_by_one_gap_run_once_at_its_end() -> None:
    start = local("Europe/Berlin", 2026, 3, 29, 0, 0)
    found = runs("0,20,40 2 * * *", "Europe/Berlin", start, start + timedelta(hours=6))
    assert found == [local("Europe/Berlin", 2026, 3, 29, 3, 0)]


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Europe/Berlin", date(2026, 10, 25)),
        ("Europe/Berlin", date(2026, 3, 29)),
        ("America/New_York", date(2026, 11, 1)),
        ("America/New_York", date(2026, 3, 8)),
        ("Australia/Sydney", date(2026, 4, 5)),
        ("Australia/Sydney", date(2026, 10, 4)),
        ("America/Santiago", date(2026, 4, 4)),
        ("America/Santiago", date(2026, 9, 6)),
    ],
)
def test_an_interval_job_runs_once_per_real_hour_across_a_change(tz: str, day: date) -> None:
    zone = ZoneInfo(tz)
    start = datetime.combine(day - timedelta(days=1), datetime.min.time(), zone)
    end = datetime.combine(day + timedelta(days=2), datetime.min.time(), zone)
    found = [r.astimezone(UTC) for r in runs("30 * * * *", tz, start, end)]
    assert all(r.minute == 30 for r in found)  # whole-hour offsets: :30 local is :30 UTC
    gaps = {later - earlier for earlier, later in itertools.pairwise(found)}
    assert gaps == {timedelta(hours=1)}
    real_hours = (end.astimezone(UTC) - start.astimezone(UTC)) // timedelta(hours=1)
    assert len(found) == real_hours


# (zone, expression, after (local), the runs expected on the day of the change (local))
INTERVAL_ON_A_CHANGED_DAY = [
    # the day of the change begins at 01:00: its hour 1 exists and runs, on a restricted day too
    ("America/Santiago", "*/15 1 * * 0", (2026, 9, 5, 12, 0), (2026, 9, 6), ["01:00", "01:15"]),
    ("America/Santiago", "*/15 1 6 9 *", (2026, 9, 5, 12, 0), (2026, 9, 6), ["01:00", "01:15"]),
    ("America/Havana", "*/15 1 * * 0", (2026, 3, 7, 12, 0), (2026, 3, 8), ["01:00", "01:15"]),
    # a 30-minute change (02:00 → 02:30): hour 3 is whole
    (
        "Australia/Lord_Howe",
        "*/20 3 * * *",
        (2026, 10, 3, 12, 0),
        (2026, 10, 4),
        ["03:00", "03:20"],
    ),
    (
        "Australia/Lord_Howe",
        "*/20 3 * * *",
        (2026, 10, 4, 2, 40),
        (2026, 10, 4),
        ["03:00", "03:20"],
    ),
    (
        "Australia/Lord_Howe",
        "*/20 * * * *",
        (2026, 10, 4, 1, 30),
        (2026, 10, 4),
        ["01:40", "02:40"],
    ),
]


@pytest.mark.parametrize(("tz", "expr", "after", "day", "expected"), INTERVAL_ON_A_CHANGED_DAY)
def test_an_interval_job_runs_at_every_real_local_time_on_the_day_of_a_change(
    tz: str, expr: str, after: tuple[int, ...], day: tuple[int, int, int], expected: list[str]
) -> None:
    # cronsim 2.8, given the zone, starts these days at a local midnight or hour that does not
    # exist and gives 2026-09-13, 2027-09-06, 2026-03-15 and 03:40 (see worker.schedule)
    zone = ZoneInfo(tz)
    start = local(tz, *after)
    found = runs(expr, tz, start, start + timedelta(days=1, hours=12))
    walls = [
        r.astimezone(zone).strftime("%H:%M")
        for r in found
        if r.astimezone(zone).date() == date(*day)
    ]
    assert walls[: len(expected)] == expected


def test_the_repeated_hour_runs_an_every_15_minutes_job_on_real_time() -> None:
    start = local("Europe/Berlin", 2026, 10, 25, 1, 50)
    found = runs("*/15 * * * *", "Europe/Berlin", start, start + timedelta(hours=3))
    walls = [r.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M%z") for r in found]
    assert walls[:10] == [
        "02:00+0200",
        "02:15+0200",
        "02:30+0200",
        "02:45+0200",
        "02:00+0100",
        "02:15+0100",
        "02:30+0100",
        "02:45+0100",
        "03:00+0100",
        "03:15+0100",
    ]


@pytest.mark.parametrize(
    ("tz", "around"),
    [
        ("Europe/Berlin", datetime(2026, 10, 25, 1, 0, tzinfo=UTC)),
        ("Europe/Berlin", datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
        ("Australia/Sydney", datetime(2026, 4, 4, 16, 0, tzinfo=UTC)),
        ("Australia/Lord_Howe", datetime(2026, 10, 3, 15, 30, tzinfo=UTC)),
    ],
)
@pytest.mark.parametrize("expr", ["30 2 * * *", "30 * * * *", "*/20 * * * *", "0 1-3 * * *"])
def test_the_next_run_always_moves_forward(tz: str, around: datetime, expr: str) -> None:
    # From every 7 minutes across the change, the next run is later, and so is the one after.
    for step in range(-40, 41):
        after = around + timedelta(minutes=7 * step)
        first = next_run_after(expr, tz, after)
        assert first is not None and first > after
        second = next_run_after(expr, tz, first)
        assert second is not None and second > first


@pytest.mark.parametrize(
    ("expr", "fixed"),
    [
        ("30 2 * * *", True),
        ("0 9-17 * * 1-5", True),
        ("0,30 8 1 * *", True),
        ("30 * * * *", False),
        ("*/15 * * * *", False),
        ("0 */2 * * *", False),
        ("*/5 3 * * *", False),
    ],
)
def test_the_job_class_follows_cronie(expr: str, fixed: bool) -> None:
    assert cron_schedule(expr, "UTC").fixed_time is fixed
