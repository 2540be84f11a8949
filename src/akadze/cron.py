"""Cron evaluation on a time zone's wall clock: pure functions, standard library + cronsim.

``cronsim`` answers the calendar question (which wall-clock minutes match an
expression); this module maps wall-clock minutes to instants, which is where
daylight-saving time makes the answer non-obvious. The rules are classic cron's:

- An expression whose hour field starts with ``*`` (``*``, ``*/2``) follows the clock as
  it passes: when clocks go back it fires in both passes of the repeated hour, and
  minutes that do not exist (clocks going forward) simply do not happen.
- Any other hour field names wall-clock hours ("fixed-hour"): when clocks go back the
  entry fires once, in the first pass; a time inside a spring-forward gap fires shifted
  by the gap (02:30 on a night where 02:00 becomes 03:00 fires at 03:30), never lost.
- Two fires that land on the same instant are one fire.

cronsim itself moves a gap time to the end of the gap (03:00 in that example) and only
applies its DST handling when neither the minute nor the hour field starts with ``*``;
we use it on naive wall-clock times only and apply the rules above ourselves.

Offsets are found by sampling the zone every hour and bisecting to the second, cached
per zone and year; this finds every real-world transition (none are less than an hour
apart).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

__all__ = [
    "CronError",
    "CronExpression",
    "fires_between",
    "latest_fire",
    "next_fire",
    "parse",
    "zone",
]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# How far a search goes before deciding an expression never fires (cronsim's own limit).
SEARCH_YEARS = 50
_HOUR = timedelta(hours=1)
_SECOND = timedelta(seconds=1)
# Transitions further back than this cannot affect what comes after an instant (no
# real-world gap or fold is anywhere near this long).
_LOOKBACK = timedelta(days=3)
# A segment of constant offset is searched at most this far before moving on.
_SEGMENT_SEARCH = timedelta(days=400)
_TINY = timedelta(microseconds=1)


class CronError(ValueError):
    """A cron expression or time zone that cannot be used."""


@dataclass(frozen=True)
class CronExpression:
    """A validated five-field cron expression (``minute hour day month weekday``)."""

    text: str
    fields: str

    @property
    def fixed_hour(self) -> bool:
        """Whether the hour field names wall-clock hours (does not start with ``*``)."""
        return not self.fields.split()[1].startswith("*")


def parse(text: str) -> CronExpression:
    """Validate a cron expression. Raises :class:`CronError` with the reason."""
    if not isinstance(text, str) or not text.strip():
        raise CronError("cron expression is empty")
    stripped = " ".join(text.split())
    fields = MACROS.get(stripped.lower(), stripped)
    if fields.startswith("@"):
        raise CronError(f"unknown cron macro {stripped!r} (known: {', '.join(MACROS)})")
    count = len(fields.split())
    if count != 5:
        raise CronError(
            f"cron expression {stripped!r} has {count} fields; "
            "expected 5 (minute hour day-of-month month day-of-week)"
        )
    try:
        sim = CronSim(fields, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise CronError(f"cron expression {stripped!r}: {exc}") from None
    except (ValueError, IndexError) as exc:  # pragma: no cover - cronsim edge cases
        raise CronError(f"cron expression {stripped!r} is invalid: {exc}") from None
    try:
        next(sim)
    except StopIteration:
        raise CronError(f"cron expression {stripped!r} never fires") from None
    return CronExpression(text=stripped, fields=fields)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``. Raises :class:`CronError` for an unknown one."""
    if not isinstance(name, str) or not name.strip():
        raise CronError("time zone name is empty")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {name!r} (expected an IANA name such as "
                        "'Europe/Berlin' or 'UTC')") from None


# -- transitions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    """The zone's UTC offset changes from ``before`` to ``after`` at instant ``at``."""

    at: datetime
    before: timedelta
    after: timedelta


def _offset(tz: ZoneInfo, at: datetime) -> timedelta:
    offset = at.astimezone(tz).utcoffset()
    assert offset is not None
    return offset


@lru_cache(maxsize=512)
def _year_transitions(tz: ZoneInfo, year: int) -> tuple[Transition, ...]:
    """Offset changes of ``tz`` during UTC year ``year``, in order."""
    found: list[Transition] = []
    at = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    current = _offset(tz, at - _SECOND)
    while at < end:
        offset = _offset(tz, at)
        if offset != current:
            # The change happened in (at - 1h, at]: bisect to the second.
            low, high = at - _HOUR, at
            while high - low > _SECOND:
                middle = low + (high - low) / 2
                middle = middle.replace(microsecond=0)
                if _offset(tz, middle) == current:
                    low = middle
                else:
                    high = middle
            found.append(Transition(high, current, offset))
            current = offset
        at += _HOUR
    return tuple(found)


def _transitions(tz: ZoneInfo, start: datetime, end: datetime) -> list[Transition]:
    """Transitions with ``start < at <= end``."""
    found: list[Transition] = []
    for year in range(start.year - 1, end.year + 1):
        found.extend(t for t in _year_transitions(tz, year) if start < t.at <= end)
    return found


def _next_transition(tz: ZoneInfo, after: datetime, horizon: datetime) -> Transition | None:
    year = after.year
    while datetime(year, 1, 1, tzinfo=UTC) <= horizon:
        transitions = _year_transitions(tz, year)
        index = bisect.bisect_right([t.at for t in transitions], after)
        if index < len(transitions):
            return transitions[index] if transitions[index].at <= horizon else None
        year += 1
    return None


# -- wall-clock matching (cronsim on naive datetimes) -------------------------------------


def _first_match(expr: CronExpression, at_least: datetime) -> datetime | None:
    """The first naive wall-clock time ``>= at_least`` matching the expression."""
    start = at_least.replace(microsecond=0)
    if start < at_least:
        start += _SECOND
    try:
        return next(iter(CronSim(expr.fields, start - _SECOND)))
    except StopIteration:
        return None


def _first_match_in(
    expr: CronExpression, low: datetime, high: datetime | None, *, exclude: tuple[
        datetime, datetime] | None = None
) -> datetime | None:
    """The first naive match in ``[low, high)``, skipping the range ``exclude``."""
    found = _first_match(expr, low)
    if found is not None and exclude is not None and exclude[0] <= found < exclude[1]:
        found = _first_match(expr, exclude[1])
    if found is None or (high is not None and found >= high):
        return None
    return found


def _naive(at: datetime) -> datetime:
    return at.replace(tzinfo=None)


# -- fires ---------------------------------------------------------------------------------


def next_fire(expr: CronExpression, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The first fire strictly after the instant ``after``, as an aware UTC datetime;
    ``None`` when the expression does not fire within the next 50 years."""
    if after.tzinfo is None:
        raise ValueError("next_fire needs a timezone-aware instant")
    after = after.astimezone(UTC)
    horizon = after + timedelta(days=366 * SEARCH_YEARS)
    # The segment containing ``after`` has a constant offset, from the last transition
    # (when it is recent enough to matter) up to the next one.
    recent = _transitions(tz, after - _LOOKBACK, after)
    previous = recent[-1] if recent else None
    offset = _offset(tz, after)
    cursor = after
    while cursor <= horizon:
        following = _next_transition(tz, cursor, cursor + _SEGMENT_SEARCH)
        if following is None:
            # No change of offset for a while: end the segment there all the same so
            # that the search stays bounded.
            following = Transition(cursor + _SEGMENT_SEARCH, offset, offset)
        fire = _segment_fire(expr, previous, following.at, offset, after)
        if fire is not None:
            return fire
        previous, offset, cursor = following, following.after, following.at
    return None


def _segment_fire(
    expr: CronExpression,
    previous: Transition | None,
    end: datetime,
    offset: timedelta,
    after: datetime,
) -> datetime | None:
    """The first fire ``> after`` among the instants from ``previous.at`` (or ``after``)
    up to ``end``, where the zone's offset is ``offset``; ``previous`` is the transition
    that began the segment, if any."""
    candidates: list[datetime] = []
    # Ordinary fires: wall time w happens at the instant w - offset.
    low = _naive(after + offset) + _TINY
    if previous is not None:
        low = max(low, _naive(previous.at + offset))
    exclude = None
    if previous is not None and expr.fixed_hour and previous.before > previous.after:
        # Clocks went back: the wall times [at + after, at + before) happen a second time
        # in this segment; a fixed-hour entry fired in the first pass already.
        exclude = (_naive(previous.at + previous.after), _naive(previous.at + previous.before))
    wall = _first_match_in(expr, low, _naive(end + offset), exclude=exclude)
    if wall is not None:
        candidates.append(wall.replace(tzinfo=UTC) - offset)
    if previous is not None and expr.fixed_hour and previous.after > previous.before:
        # Clocks went forward: the wall times [at + before, at + after) never happen; a
        # fixed-hour entry fires there shifted by the gap, at the instant wall - before.
        gap_low = max(
            _naive(previous.at + previous.before), _naive(after + previous.before) + _TINY
        )
        shifted = _first_match_in(expr, gap_low, _naive(previous.at + previous.after))
        if shifted is not None:
            candidates.append(shifted.replace(tzinfo=UTC) - previous.before)
    return min(candidates) if candidates else None


def fires_between(
    expr: CronExpression, tz: ZoneInfo, start: datetime, end: datetime
) -> Iterator[datetime]:
    """The fires ``t`` with ``start < t <= end``, in order (aware UTC datetimes)."""
    at = start
    while True:
        fire = next_fire(expr, tz, at)
        if fire is None or fire > end:
            return
        yield fire
        at = fire


def latest_fire(
    expr: CronExpression, tz: ZoneInfo, at: datetime, *, since: datetime
) -> datetime | None:
    """The latest fire ``t`` with ``since < t <= at``, or ``None``.

    Probes backwards in growing windows (a minute, four, sixteen, ...) so that a dense
    expression costs a couple of evaluations, whatever the distance to ``since``."""
    span = timedelta(minutes=1)
    while True:
        start = max(since, at - span)
        fire = next_fire(expr, tz, start)
        if fire is not None and fire <= at:
            while True:
                following = next_fire(expr, tz, fire)
                if following is None or following > at:
                    return fire
                fire = following
        if start == since:
            return None
        span *= 4
