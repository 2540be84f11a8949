"""Cron on a zone's wall clock across daylight-saving transitions: the named cases."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from akadze import cron


def local_fires(expr: str, zone: str, start: datetime, count: int) -> list[str]:
    """The next ``count`` fires after local ``start``, as local wall times with offsets."""
    tz = ZoneInfo(zone)
    parsed = cron.parse(expr)
    at = start.replace(tzinfo=tz).astimezone(UTC)
    out = []
    for _ in range(count):
        fire = cron.next_fire(parsed, tz, at)
        assert fire is not None
        out.append(fire.astimezone(tz).strftime("%m-%d %H:%M%z"))
        at = fire
    return out


def test_berlin_spring_forward_shifts_a_fixed_hour_by_the_gap() -> None:
    # 2024-03-31: 02:00 CET becomes 03:00 CEST.
    assert local_fires("30 2 * * *", "Europe/Berlin", datetime(2024, 3, 30, 12), 2) == [
        "03-31 03:30+0200",
        "04-01 02:30+0200",
    ]


def test_cronsim_alone_moves_a_gap_time_to_the_end_of_the_gap() -> None:
    # Why akadze.cron wraps cronsim: it would fire at 03:00, not shifted by the gap.
    tz = ZoneInfo("Europe/Berlin")
    first = next(CronSim("30 2 * * *", datetime(2024, 3, 30, 12, tzinfo=tz)))
    assert first.strftime("%H:%M") == "03:00"


def test_two_fires_landing_on_the_same_instant_run_once() -> None:
    # 02:30 is shifted to 03:30, where the 03:30 entry fires too.
    assert local_fires("30 2,3 * * *", "Europe/Berlin", datetime(2024, 3, 30, 12), 3) == [
        "03-31 03:30+0200",
        "04-01 02:30+0200",
        "04-01 03:30+0200",
    ]


def test_berlin_fall_back_fixed_hour_fires_once_star_hours_fire_twice() -> None:
    # 2024-10-27: 03:00 CEST becomes 02:00 CET; 02:xx happens twice.
    assert local_fires("30 2 * * *", "Europe/Berlin", datetime(2024, 10, 26, 12), 2) == [
        "10-27 02:30+0200",
        "10-28 02:30+0100",
    ]
    assert local_fires("30 * * * *", "Europe/Berlin", datetime(2024, 10, 27, 1), 4) == [
        "10-27 01:30+0200",
        "10-27 02:30+0200",
        "10-27 02:30+0100",
        "10-27 03:30+0100",
    ]


def test_fixed_hour_with_star_minutes_is_still_fixed_hour() -> None:
    # cronsim treats this as a wildcard job; the hour field is what decides here.
    assert local_fires("*/20 2 * * *", "Europe/Berlin", datetime(2024, 3, 31, 0), 4) == [
        "03-31 03:00+0200",
        "03-31 03:20+0200",
        "03-31 03:40+0200",
        "04-01 02:00+0200",
    ]
    assert local_fires("*/30 1 * * *", "America/New_York", datetime(2024, 11, 3, 0), 3) == [
        "11-03 01:00-0400",
        "11-03 01:30-0400",
        "11-04 01:00-0500",
    ]


def test_new_york() -> None:
    # 2024-03-10: 02:00 EST becomes 03:00 EDT; 2024-11-03: 02:00 EDT becomes 01:00 EST.
    assert local_fires("15 2 * * *", "America/New_York", datetime(2024, 3, 9, 12), 2) == [
        "03-10 03:15-0400",
        "03-11 02:15-0400",
    ]
    assert local_fires("45 1 * * *", "America/New_York", datetime(2024, 11, 2, 12), 2) == [
        "11-03 01:45-0400",
        "11-04 01:45-0500",
    ]
    assert local_fires("45 */1 * * *", "America/New_York", datetime(2024, 11, 3, 0, 50), 3) == [
        "11-03 01:45-0400",
        "11-03 01:45-0500",
        "11-03 02:45-0500",
    ]


def test_lord_howe_half_hour_shift() -> None:
    # 2024-10-06: 02:00 +1030 becomes 02:30 +11; 2024-04-07: 02:00 +11 becomes 01:30 +1030.
    assert local_fires("15 2 * * *", "Australia/Lord_Howe", datetime(2024, 10, 5, 12), 2) == [
        "10-06 02:45+1100",
        "10-07 02:15+1100",
    ]
    assert local_fires("45 1 * * *", "Australia/Lord_Howe", datetime(2024, 4, 6, 12), 2) == [
        "04-07 01:45+1100",
        "04-08 01:45+1030",
    ]
    assert local_fires("45 * * * *", "Australia/Lord_Howe", datetime(2024, 4, 7, 0, 50), 3) == [
        "04-07 01:45+1100",
        "04-07 01:45+1030",
        "04-07 02:45+1030",
    ]


def test_midnight_transition() -> None:
    # America/Santiago 2024-09-08: 00:00 -04 becomes 01:00 -03; midnight does not exist.
    assert local_fires("0 0 * * *", "America/Santiago", datetime(2024, 9, 6, 12), 3) == [
        "09-07 00:00-0400",
        "09-08 01:00-0300",
        "09-09 00:00-0300",
    ]
    # 2024-04-07: 00:00 -03 becomes 23:00 -04 the day before; 23:30 happens twice.
    assert local_fires("30 23 * * *", "America/Santiago", datetime(2024, 4, 6, 12), 2) == [
        "04-06 23:30-0300",
        "04-07 23:30-0400",
    ]


def test_a_skipped_day_fires_shifted_and_merges_with_the_next_days_fire() -> None:
    # Pacific/Apia skipped 2011-12-30 entirely: 12:00 on the 30th shifts by 24 h onto
    # the 31st at 12:00, the same instant as the 31st's own fire.
    assert local_fires("0 12 * * *", "Pacific/Apia", datetime(2011, 12, 29, 13), 2) == [
        "12-31 12:00+1400",
        "01-01 12:00+1400",
    ]


def test_macros_and_zone_without_dst() -> None:
    assert local_fires("@daily", "Asia/Kolkata", datetime(2024, 1, 1, 5), 2) == [
        "01-02 00:00+0530",
        "01-03 00:00+0530",
    ]
    assert local_fires("@yearly", "UTC", datetime(2024, 5, 1), 2) == [
        "01-01 00:00+0000",
        "01-01 00:00+0000",
    ]


def test_latest_fire() -> None:
    parsed = cron.parse("*/15 * * * *")
    tz = ZoneInfo("UTC")
    at = datetime(2024, 1, 1, 10, 40, tzinfo=UTC)
    assert cron.latest_fire(parsed, tz, at, since=datetime(2024, 1, 1, 10, tzinfo=UTC)) == (
        datetime(2024, 1, 1, 10, 30, tzinfo=UTC)
    )
    assert cron.latest_fire(parsed, tz, at, since=datetime(2024, 1, 1, 10, 31, tzinfo=UTC)) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("* * * *", "has 4 fields"),
        ("0 * * * * *", "has 6 fields"),
        ("61 * * * *", "Bad minute"),
        ("0 25 * * *", "Bad hour"),
        ("0 0 31 2 *", "Bad day-of-month"),
        ("@sometimes", "unknown cron macro"),
    ],
)
def test_bad_expressions(text: str, message: str) -> None:
    with pytest.raises(cron.CronError, match=message):
        cron.parse(text)


def test_unknown_zone() -> None:
    with pytest.raises(cron.CronError, match="unknown time zone 'Mars/Olympus'"):
        cron.zone("Mars/Olympus")
    with pytest.raises(cron.CronError, match="unknown time zone"):
        cron.zone("../etc/passwd")
