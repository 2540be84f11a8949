"""The server's clock as a claim loop sees it: when a moment of the server's clock
comes in this process's loop time.

A start-rate window opens at a moment of the server's clock: the start mark that
leaves it, plus the window. The claim loop waits for it on its own monotonic
clock, so it needs the offset between the two (loop = server + offset).

Each reply that carries the server's ``clock_timestamp()`` bounds that offset from
above: the server read its clock before the reply left, and the loop read its own
(``received``) after the reply arrived, so ``offset <= received - server``. The
smallest recent bound is the tightest, and still never below the true offset: a
loop that waits for ``server + bound`` never wakes before the moment it waits for,
and wakes at most the quickest reply's travel time after it (tenths of a
millisecond beside the server, the one-way network time across one).

Counting the opening's distance from the moment its reply arrived instead opens
every window late by that reply's whole time on the wire and in the server (0.4-3 ms
measured), and the lag adds up from window to window, since the next one opens a
window after the late start.

Bounds older than :data:`KEEP` seconds are dropped: the two clocks may drift apart
(an NTP-slewed wall clock against a monotonic one), and an old bound could then be
below the true offset. Waking early costs only a claim that finds no room yet and
learns the opening again; the limit is the server's to keep, never the loop's.

Pure: plain floats in, no I/O, property-tested (tests/test_server_clock.py).
"""

from __future__ import annotations

from collections import deque

#: Seconds a bound is kept.
KEEP = 10.0
#: The most bounds kept.
SAMPLES = 16


class ServerClock:
    """Bounds on ``offset`` (loop time = server time + offset), from replies."""

    def __init__(self, keep: float = KEEP, samples: int = SAMPLES) -> None:
        self._keep = keep
        self._bounds: deque[tuple[float, float]] = deque(maxlen=samples)

    def observed(self, received: float, server: float) -> None:
        """A reply that arrived at loop time ``received`` carried the server's clock
        ``server`` (seconds, any epoch, the same for every call)."""
        self._bounds.append((received, received - server))
        while self._bounds and self._bounds[0][0] < received - self._keep:
            self._bounds.popleft()

    def to_loop(self, server: float) -> float:
        """The loop time at which the server's clock will have passed ``server``: no
        earlier than the true moment, later by the quickest kept reply's travel."""
        if not self._bounds:
            raise LookupError("no reply of the server observed yet")
        return server + min(bound for _, bound in self._bounds)
