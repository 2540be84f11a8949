"""Retry delays: the default exponential backoff with jitter, and clamping.

A pure module: plain numbers in, plain numbers out, standard library only. The
worker passes in the random draw, so every function here is deterministic and
property-tested.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import TypeAlias

#: The type of a task's ``backoff``: the attempt number that just failed (1 for the
#: first run) -> how long to wait before the next (``akadze.BackoffPolicy``).
BackoffPolicy: TypeAlias = Callable[[int], timedelta]

#: The first retry waits about one second, each next one twice as long ...
BASE_SECONDS = 1.0
#: ... up to five minutes.
CAP_SECONDS = 300.0
#: The jitter keeps at least this share of the delay (so [50 %, 100 %]).
JITTER_FLOOR = 0.5
#: No delay is ever longer than a year (nor shorter than zero).
MAX_DELAY_SECONDS = 365 * 24 * 3600.0


def exponential(attempt: int) -> float:
    """``2^(attempt-1)`` seconds capped at :data:`CAP_SECONDS`, before jitter.

    ``attempt`` is the number of the run that just failed (1 for the first run);
    anything below 1 counts as 1.
    """
    exponent = max(attempt, 1) - 1
    # 2^9 = 512 > 300: stop before the power grows (attempt may be ~2^31).
    if exponent >= 9:
        return CAP_SECONDS
    return min(BASE_SECONDS * 2.0**exponent, CAP_SECONDS)


def jittered(seconds: float, draw: float) -> float:
    """``seconds`` scaled into [JITTER_FLOOR, 1] by ``draw``, a number in [0, 1]."""
    draw = min(max(draw, 0.0), 1.0) if math.isfinite(draw) else 1.0
    return seconds * (JITTER_FLOOR + (1.0 - JITTER_FLOOR) * draw)


def default_delay(attempt: int, draw: float) -> float:
    """The default retry delay in seconds after run number ``attempt`` failed."""
    return clamp(jittered(exponential(attempt), draw))


def clamp(seconds: float) -> float:
    """A delay forced into [0, MAX_DELAY_SECONDS]; NaN counts as 0."""
    if math.isnan(seconds):
        return 0.0
    return min(max(seconds, 0.0), MAX_DELAY_SECONDS)


def to_seconds(delay: timedelta | float | int) -> float:
    """A delay given as a timedelta or a number of seconds, clamped.

    Raises TypeError for anything else (including booleans).
    """
    if isinstance(delay, timedelta):
        return clamp(delay.total_seconds())
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise TypeError(f"a delay must be a timedelta or a number of seconds, got {delay!r}")
    return clamp(float(delay))


#: Reconnecting after a database error: quick at first, then every few seconds.
RECONNECT_FIRST = 0.05
RECONNECT_CAP = 5.0


def reconnect_delay(failures: int, draw: float) -> float:
    """Seconds to wait after ``failures`` database errors in a row (1 for the first),
    jittered like retries. The first retry is almost immediate: a killed connection
    is usually replaced at once."""
    exponent = min(max(failures, 1) - 1, 16)
    return jittered(min(RECONNECT_FIRST * 2.0**exponent, RECONNECT_CAP), draw)
