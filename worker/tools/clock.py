"""The built-in clock: ``clock_now`` (``read``, scope ``clock``) tells the model the time.

Models don't know what time it is; missions often depend on it ("summarise today's notes").
The clock is injectable so tests (and replays) see a fixed time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from planner.tools import ToolContext, ToolSpec

__all__ = ["SCOPE", "clock_tools", "utc_now"]

SCOPE = "clock"


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC (the default clock)."""
    return datetime.now(UTC)


def clock_tools(now: Callable[[], datetime] = utc_now) -> list[ToolSpec]:
    """The clock tool. ``now`` must return a timezone-aware datetime (any zone).

    ``clock_now`` answers ``{"now": ISO-8601 with offset, "date", "time", "weekday",
    "timezone", "utc_offset", "unix_time_s"}`` in the requested IANA zone (default UTC); an
    unknown zone raises ``ValueError`` naming it.
    """

    async def clock_now(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        zone_name = str(args.get("timezone", "UTC"))
        zone = _zone(zone_name)
        moment = now()
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise RuntimeError("the clock returned a naive datetime; it must be timezone-aware")
        local = moment.astimezone(zone)
        return {
            "now": local.isoformat(timespec="seconds"),
            "date": local.date().isoformat(),
            "time": local.time().isoformat(timespec="seconds"),
            "weekday": _WEEKDAYS[local.weekday()],
            "timezone": zone_name,
            "utc_offset": _utc_offset(local.utcoffset()),
            "unix_time_s": int(moment.timestamp()),
        }

    return [
        ToolSpec(
            name="clock_now",
            description=(
                "The current date, time and weekday, in UTC or in the IANA timezone you name "
                "(e.g. 'Europe/Berlin', 'America/New_York')."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "timezone": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 64,
                        "default": "UTC",
                        "description": "An IANA timezone name, e.g. 'Europe/Berlin'; default UTC.",
                    }
                },
                "required": [],
                "additionalProperties": False,
            },
            policy_hint="read",
            scope=SCOPE,
            handler=clock_now,
        )
    ]


_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
"""``datetime.weekday()``'s names, in English whatever the process's locale (``%A``'s are
the locale's)."""


@cache
def _utc_offset(offset: timedelta | None) -> str:
    """``offset`` as ``±HH:MM`` (``strftime("%z")`` with a colon after the hours: ``+05:30``;
    a zone's historical offset in seconds keeps them, ``+00:0921``), worked out once per
    offset (``strftime`` costs more than the rest of the answer)."""
    z = datetime(2000, 1, 1, tzinfo=timezone(offset or timedelta())).strftime("%z")
    return z[:3] + ":" + z[3:]


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"unknown timezone {name!r}: use an IANA name such as 'UTC', 'Europe/Berlin' "
            "or 'America/New_York'"
        ) from None
