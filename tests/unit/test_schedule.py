"""Cron next-run math: standard day-of-week numbering, timezones, DST, coalescing, errors."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from worker.schedule import ScheduleError, next_run_after

BERLIN = ZoneInfo("Europe/Berlin")
# Sunday 2026-11-29 12:00 Berlin
SUNDAY_NOON = datetime(2026, 11, 29, 12, 0, tzinfo=BERLIN)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0 9 * * 1", datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)),  # 1 = Monday (POSIX cron)
        ("0 9 * * 0", datetime(2026, 12, 6, 9, 0, tzinfo=BERLIN)),  # 0 = Sunday
        ("0 9 * * 7", datetime(2026, 12, 6, 9, 0, tzinfo=BERLIN)),  # 7 = Sunday too
        ("0 13 * * 0", datetime(2026, 11, 29, 13, 0, tzinfo=BERLIN)),  # later today
        ("0 9 * * 1-5", datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)),
        ("0 9 * * 6", datetime(2026, 12, 5, 9, 0, tzinfo=BERLIN)),  # 6 = Saturday
        ("0 9 * * 5-7", datetime(2026, 12, 4, 9, 0, tzinfo=BERLIN)),  # Fri-Sun
        ("0 9 * * */2", datetime(2026, 12, 1, 9, 0, tzinfo=BERLIN)),  # Sun,Tue,Thu,Sat
        ("0 9 * * mon", datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)),
        ("*/15 * * * *", datetime(2026, 11, 29, 12, 15, tzinfo=BERLIN)),
        ("30 8 1 * *", datetime(2026, 12, 1, 8, 30, tzinfo=BERLIN)),
        ("0 9 * * MON", datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)),  # names in any case
        ("0 9 * * fri-sun", datetime(2026, 12, 4, 9, 0, tzinfo=BERLIN)),
        ("0 9 * * 5-0", datetime(2026, 12, 4, 9, 0, tzinfo=BERLIN)),  # Fri through Sunday
        ("0 9 * nov-dec sat", datetime(2026, 12, 5, 9, 0, tzinfo=BERLIN)),
        ("0 9 * jan *", datetime(2027, 1, 1, 9, 0, tzinfo=BERLIN)),
        ("5/20 * * * *", datetime(2026, 11, 29, 12, 5, tzinfo=BERLIN)),  # 5-59/20
        ("0 9 2-31/7 * *", datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)),
        ("*/20,7 * * * *", datetime(2026, 11, 29, 12, 7, tzinfo=BERLIN)),  # a list after */S
        ("0 9 * * sun,7", datetime(2026, 12, 6, 9, 0, tzinfo=BERLIN)),
        ("0 0 29 2 *", datetime(2028, 2, 29, 0, 0, tzinfo=BERLIN)),  # leap days only
    ],
)
def test_next_run_uses_standard_cron_semantics(expr: str, expected: datetime) -> None:
    assert next_run_after(expr, "Europe/Berlin", SUNDAY_NOON) == expected


def test_next_run_is_strictly_after_the_given_time() -> None:
    at_nine = datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)
    assert next_run_after("0 9 * * *", "Europe/Berlin", at_nine) == datetime(
        2026, 12, 1, 9, 0, tzinfo=BERLIN
    )


def test_wall_clock_time_is_kept_across_a_dst_change() -> None:
    # Berlin leaves summer time on 2026-10-25: 09:00 local is 07:00 UTC before, 08:00 after.
    before = next_run_after("0 9 * * *", "Europe/Berlin", datetime(2026, 10, 23, 12, tzinfo=UTC))
    after = next_run_after("0 9 * * *", "Europe/Berlin", datetime(2026, 10, 25, 12, tzinfo=UTC))
    assert before is not None and after is not None
    assert before.astimezone(UTC).hour == 7
    assert after.astimezone(UTC).hour == 8


def test_missed_runs_coalesce_into_the_next_future_time() -> None:
    # Down for three days: the next run is computed from now, not from the missed time.
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert next_run_after("0 * * * *", "UTC", now) == datetime(2026, 11, 29, 13, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "tz", "message"),
    [
        ("* * * *", "UTC", "expected 5 fields"),
        ("61 * * * *", "UTC", "invalid cron expression '61 * * * *'"),
        ("0 9 * * 8", "UTC", "outside 0-7"),
        ("0 9 * * mon-", "UTC", "invalid cron expression"),
        ("0 9 * * *", "Mars/Olympus", "unknown timezone 'Mars/Olympus'"),
        ("not a cron", "UTC", "expected 5 fields"),
        # Names are whole three-letter names; other words, and non-POSIX syntax, are refused.
        ("0 9 * * monkey", "UTC", "day-of-week 'monkey' in 'monkey' is not a number"),
        ("0 9 * * monday", "UTC", "day-of-week 'monday'"),
        ("0 9 * * mo", "UTC", "day-of-week 'mo'"),
        ("0 9 * * sun-thursday", "UTC", "day-of-week 'thursday'"),
        ("0 9 * january *", "UTC", "month 'january'"),
        ("0 9 * * mon#2", "UTC", "day-of-week 'mon#2'"),
        ("0 9 L * *", "UTC", "day-of-month 'L'"),
        ("0 9 last * *", "UTC", "day-of-month 'last'"),
        ("0 9 ? * *", "UTC", "day-of-month '?'"),
        ("0 9 * * ?", "UTC", "day-of-week '?'"),
        ("0 9 1,,2 * *", "UTC", "day-of-month '' in ''"),
        ("0 +9 * * *", "UTC", "hour '+9'"),
        ("0 \uff19 * * *", "UTC", "hour '\uff19'"),  # a full-width digit
        ("*/0 * * * *", "UTC", "minute step '0'"),
        ("0 24 * * *", "UTC", "hour '24' is outside 0-23"),
        ("0 9 5-1 * *", "UTC", "range '5-1' runs backwards"),
        ("0 9 * 3 sun-mon-tue", "UTC", "day-of-week 'mon-tue'"),
    ],
)
def test_bad_schedules_raise_a_schedule_error_naming_the_value(
    expr: str, tz: str, message: str
) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        next_run_after(expr, tz, SUNDAY_NOON)


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 12 31 4,6 *", "0 0 31 2-4/2 *"])
def test_an_expression_no_date_matches_is_valid_and_never_runs(expr: str) -> None:
    # `missions add` refuses it (the cron "never fires"); a stored one ends its mission
    assert next_run_after(expr, "Europe/Berlin", SUNDAY_NOON) is None


def test_either_day_field_matching_is_enough_even_if_one_never_does() -> None:
    # 30 February never comes, the Mondays of February do
    assert next_run_after("0 0 30 2 mon", "UTC", SUNDAY_NOON) == datetime(
        2027, 2, 1, 0, 0, tzinfo=UTC
    )


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_run_after("0 9 * * *", "UTC", datetime(2026, 11, 29, 12, 0))  # noqa: DTZ001


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # both day fields restricted: the 1st of the month OR a Monday (crontab(5))
        (
            "0 9 1 * mon",
            "2026-06-01T12:00+00:00",
            [
                "2026-06-08T09:00",
                "2026-06-15T09:00",
                "2026-06-22T09:00",
                "2026-06-29T09:00",
                "2026-07-01T09:00",
                "2026-07-06T09:00",
            ],
        ),
        ("0 0 13 * 5", "2026-02-12T00:00+00:00", ["2026-02-13T00:00", "2026-02-20T00:00"]),
        # one of them starts with * (cronie's DOM_STAR/DOW_STAR): both must match
        ("0 9 */10 * mon", "2026-06-01T12:00+00:00", ["2026-08-31T09:00", "2026-09-21T09:00"]),
        ("0 9 1 * *", "2026-06-01T12:00+00:00", ["2026-07-01T09:00", "2026-08-01T09:00"]),
    ],
)
def test_day_of_month_and_day_of_week_follow_crontab(
    expr: str, after: str, expected: list[str]
) -> None:
    runs: list[str] = []
    moment = datetime.fromisoformat(after)
    for _ in expected:
        found = next_run_after(expr, "UTC", moment)
        assert found is not None
        runs.append(found.strftime("%Y-%m-%dT%H:%M"))
        moment = found
    assert runs == expected


@pytest.mark.parametrize(
    ("expr", "zone", "minute"),
    [
        ("*/5 * * * *", "UTC", datetime(2026, 3, 1, 12, 5, tzinfo=UTC)),
        ("0 * * * *", "Europe/Berlin", datetime(2026, 3, 29, 0, 59, tzinfo=UTC)),  # DST
        ("30 2 * * *", "America/New_York", datetime(2026, 11, 1, 6, 30, tzinfo=UTC)),
        # a zone whose offset had seconds then (+00:19:32): runs fall between UTC minutes
        ("* * * * *", "Europe/Amsterdam", datetime(1930, 6, 1, 11, 40, tzinfo=UTC)),
    ],
)
def test_the_cached_minute_gives_what_the_schedule_says_for_every_second_of_it(
    expr: str, zone: str, minute: datetime
) -> None:
    from worker.schedule import cron_schedule

    for second in (0, 1, 27, 28, 29, 59):
        for micro in (0, 999_999):
            after = minute.replace(second=second, microsecond=micro)
            assert next_run_after(expr, zone, after) == cron_schedule(expr, zone).next_after(
                after
            ), after
