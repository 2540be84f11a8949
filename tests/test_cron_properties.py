"""Property tests of cron evaluation against a brute-force oracle.

The oracle walks every minute of a window around a real time-zone transition and
decides from first principles (the zone's wall clock, classic cron's DST rules) which
instants are fires; ``akadze.cron`` must produce exactly those, in strictly increasing
order. Expressions come from a small grammar whose matching the oracle does itself, so
the oracle does not share code with cronsim or with akadze.cron.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akadze import cron

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # 30-minute shift
    "America/Santiago",  # transitions at midnight
    "America/Havana",  # midnight
    "Asia/Beirut",  # midnight
    "America/Sao_Paulo",  # midnight (until 2019)
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",  # "negative" DST in tzdata
    "Africa/Casablanca",  # several transitions a year around Ramadan
    "Pacific/Apia",  # skipped a whole day in 2011
    "Antarctica/Troll",  # two-hour DST
    "America/St_Johns",
    "Australia/Sydney",
    "Asia/Tehran",
]


@st.composite
def field(draw: st.DrawFn, low: int, high: int) -> tuple[str, frozenset[int]]:
    """A cron field over [low, high] and the set of values it matches."""
    kind = draw(st.sampled_from(["star", "step", "one", "list", "range"]))
    if kind == "star":
        return "*", frozenset(range(low, high + 1))
    if kind == "step":
        step = draw(st.integers(2, max(2, (high - low) // 2)))
        return f"*/{step}", frozenset(range(low, high + 1, step))
    if kind == "one":
        value = draw(st.integers(low, high))
        return str(value), frozenset({value})
    if kind == "list":
        values = draw(st.lists(st.integers(low, high), min_size=2, max_size=4, unique=True))
        return ",".join(map(str, sorted(values))), frozenset(values)
    first = draw(st.integers(low, high - 1))
    last = draw(st.integers(first + 1, min(high, first + 5)))
    return f"{first}-{last}", frozenset(range(first, last + 1))


@st.composite
def expressions(draw: st.DrawFn) -> tuple[str, frozenset[int], frozenset[int], bool]:
    minute_text, minutes = draw(field(0, 59))
    hour_text, hours = draw(field(0, 23))
    return f"{minute_text} {hour_text} * * *", minutes, hours, not hour_text.startswith("*")


def _ambiguous(wall: datetime, tz: ZoneInfo) -> bool:
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    return first != wall.replace(tzinfo=tz, fold=1).utcoffset()


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    return wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall


def oracle(
    tz: ZoneInfo, minutes: frozenset[int], hours: frozenset[int], fixed: bool,
    start: datetime, end: datetime,
) -> list[datetime]:
    """Fires t with start < t <= end, decided minute by minute."""
    fires: set[datetime] = set()
    at = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while at <= end:
        local = at.astimezone(tz)
        wall = local.replace(tzinfo=None)
        if wall.minute in minutes and wall.hour in hours:
            second_pass = local.fold == 1 and _ambiguous(wall, tz)
            if not (fixed and second_pass):
                fires.add(at)
        at += timedelta(minutes=1)
    if fixed:
        # Wall times that never happen fire shifted by the gap.
        wall = start.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
        wall -= timedelta(days=2)
        last = end.astimezone(tz).replace(tzinfo=None) + timedelta(days=2)
        while wall <= last:
            if wall.minute in minutes and wall.hour in hours and not _exists(wall, tz):
                shifted = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
                if start < shifted <= end:
                    fires.add(shifted)
            wall += timedelta(minutes=1)
    return sorted(fires)


@st.composite
def windows(draw: st.DrawFn) -> tuple[ZoneInfo, datetime, datetime]:
    """A zone and a window of up to three days around one of its real transitions."""
    name = draw(st.sampled_from(ZONES))
    tz = ZoneInfo(name)
    year = draw(st.integers(1995, 2030))
    transitions = cron._year_transitions(tz, year)
    if transitions:
        centre = draw(st.sampled_from(transitions)).at
    else:
        centre = datetime(year, 6, 1, tzinfo=UTC)
    before = draw(st.integers(0, 36 * 60))
    after = draw(st.integers(1, 36 * 60))
    seconds = draw(st.integers(0, 59))
    start = centre - timedelta(minutes=before, seconds=seconds)
    return tz, start, centre + timedelta(minutes=after)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=expressions(), window=windows())
def test_fires_match_the_oracle_across_transitions(
    expr: tuple[str, frozenset[int], frozenset[int], bool],
    window: tuple[ZoneInfo, datetime, datetime],
) -> None:
    text, minutes, hours, fixed = expr
    tz, start, end = window
    parsed = cron.parse(text)
    assert parsed.fixed_hour is fixed
    got = list(cron.fires_between(parsed, tz, start, end))
    assert got == sorted(set(got)), "fires must be strictly increasing"
    assert got == oracle(tz, minutes, hours, fixed, start, end)


@settings(max_examples=150, deadline=None)
@given(
    expr=expressions(),
    name=st.sampled_from(ZONES),
    at=st.datetimes(min_value=datetime(1995, 1, 1), max_value=datetime(2035, 1, 1),
                    timezones=st.just(UTC)),
)
def test_next_fire_is_later_and_nothing_is_skipped(
    expr: tuple[str, frozenset[int], frozenset[int], bool], name: str, at: datetime
) -> None:
    text, minutes, hours, fixed = expr
    tz = ZoneInfo(name)
    parsed = cron.parse(text)
    fire = cron.next_fire(parsed, tz, at)
    assert fire is not None and fire > at
    # Every expression of the grammar fires at least daily (or at a shifted time).
    assert fire - at <= timedelta(days=2)
    # No fire in between: the oracle over (at, fire] finds exactly this one.
    assert oracle(tz, minutes, hours, fixed, at, fire) == [fire]
    local = fire.astimezone(tz)
    wall = local.replace(tzinfo=None)
    if not (wall.minute in minutes and wall.hour in hours):
        # Not a wall-clock match: must be a gap shift of a fixed-hour entry.
        assert fixed
        shift = local.utcoffset() - (fire - timedelta(hours=6)).astimezone(tz).utcoffset()  # type: ignore[operator]
        assert shift > timedelta(0)
        unshifted = wall - shift
        assert unshifted.minute in minutes and unshifted.hour in hours
        assert not _exists(unshifted, tz)


@settings(max_examples=60, deadline=None)
@given(
    text=st.sampled_from(["@daily", "@hourly", "0 9 * * 1-5", "15 3 1 * *", "0 0 29 2 *",
                          "*/7 * * * *", "0 12 * * 0", "59 23 31 12 *"]),
    name=st.sampled_from([*ZONES, "UTC", "Asia/Tokyo", "Asia/Kolkata"]),
    at=st.datetimes(min_value=datetime(1995, 1, 1), max_value=datetime(2035, 1, 1),
                    timezones=st.just(UTC)),
)
def test_calendar_expressions_fire_in_order(text: str, name: str, at: datetime) -> None:
    parsed = cron.parse(text)
    tz = ZoneInfo(name)
    fires = []
    current = at
    for _ in range(5):
        fire = cron.next_fire(parsed, tz, current)
        assert fire is not None
        assert fire > current
        fires.append(fire)
        current = fire
    assert fires == sorted(set(fires))


@settings(max_examples=100, deadline=None)
@given(
    expr=expressions(),
    window=windows(),
    grace_minutes=st.integers(1, 3 * 24 * 60),
)
def test_latest_fire_is_the_last_fire_of_the_window(
    expr: tuple[str, frozenset[int], frozenset[int], bool],
    window: tuple[ZoneInfo, datetime, datetime],
    grace_minutes: int,
) -> None:
    parsed = cron.parse(expr[0])
    tz, _, at = window
    since = at - timedelta(minutes=grace_minutes)
    fires = list(cron.fires_between(parsed, tz, since, at))
    assert cron.latest_fire(parsed, tz, at, since=since) == (fires[-1] if fires else None)
