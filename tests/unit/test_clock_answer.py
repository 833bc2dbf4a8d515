"""``clock_now``'s answer, field by field, is what ``strftime`` says in every IANA zone (it is
worked out without ``strftime``, which costs more than the rest of the answer), except that
the weekday is English whatever the process's locale."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from worker.tools.clock import clock_tools

MOMENTS = [
    datetime(1850, 7, 1, 12, 0, 0, tzinfo=UTC),  # local mean times: offsets in seconds
    datetime(1937, 7, 1, 12, 0, 0, tzinfo=UTC),  # Amsterdam's +00:20
    datetime(2025, 3, 30, 0, 30, 5, tzinfo=UTC),  # a DST change in Europe
    datetime(2026, 12, 2, 23, 59, 59, tzinfo=UTC),
]


def answer(moment: datetime, zone: str) -> dict[str, Any]:
    coro = clock_tools(lambda: moment)[0].handler({"timezone": zone}, None)  # type: ignore[arg-type]
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("clock_now waited")


@pytest.mark.parametrize("moment", MOMENTS, ids=lambda m: m.isoformat())
def test_every_zone_answers_as_strftime_says(moment: datetime) -> None:
    for zone in sorted(zoneinfo.available_timezones()):
        local = moment.astimezone(zoneinfo.ZoneInfo(zone))
        z = local.strftime("%z")
        got = answer(moment, zone)
        assert (got["time"], got["utc_offset"]) == (
            local.strftime("%H:%M:%S"),
            z[:3] + ":" + z[3:],
        ), zone
        assert (
            got["weekday"]
            == ("Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()[local.weekday()])
        )


def test_an_offset_with_seconds_keeps_them() -> None:
    monrovia = answer(datetime(1950, 1, 1, tzinfo=UTC), "Africa/Monrovia")
    assert monrovia["utc_offset"] == "-00:4430"  # strftime's %z, a colon after the hours
    assert answer(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=1), "UTC")["time"] == (
        "01:00:00"
    )
