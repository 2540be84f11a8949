"""Start-rate windows of one queue's claim loop: when the next one opens, and the
claim sent for that moment.

A claim that left a key without room by its ``max_starts`` asks
(``limit_next_start``) when the soonest window of those keys opens. The loop then
waits for it and claims again, and that claim starts the key's next job at the
opening itself, not a claim's trip after it:

- the opening (a moment of the server's clock) comes into the loop's own time by
  :class:`~._serverclock.ServerClock`, which is never early;
- the loop wakes :data:`WINDOW_LEAD` before it (:meth:`Openings.learn` sets the
  wake-up) and sends its claim with ``not_before`` set to the opening
  (:meth:`Openings.claim_for`): the server waits for that moment, then takes the
  queue's turn (claim_start_at, 5 ms at most), so the claim's clock, which the
  start marks take, is the first moment the window is open when the turn is free.

Counted from the loop's side instead, each window opened later than the last
one's first start by the claim's own trip (about a millisecond on one host), and a
key with ``max_starts = 10`` per second started 9.986 jobs a second.

With an injected clock (tests) the opening is counted from the reply's arrival and
nothing waits on the server (the claim's clock is the injected one).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from psycopg.types.json import Jsonb

from .. import queries
from ._connections import Connections
from ._serverclock import ServerClock
from ._settings import Settings
from ._wakeup import Wakeup

logger = logging.getLogger("akadze.worker")

#: How long before a start-rate window opens its claim is sent: the claim waits on
#: the server for the opening itself (claim_start_at, 5 ms at most), so this
#: covers the claim's way there (the wake-up, the pipeline) on a busy host; the
#: claim connection is busy about this long at each opening (not the queue's
#: turn: the wait comes before it).
WINDOW_LEAD = 0.003
#: A claim sent more than this before the opening (woken by something else) does
#: not wait for it.
WINDOW_EARLY = WINDOW_LEAD + 0.0005


def next_wake(when: float, at: datetime | None, now: float,
              lead: float = WINDOW_LEAD) -> float | None:
    """When the loop wakes for an opening at loop time ``when`` (``at``: the same
    moment of the server's clock, None when the claim cannot wait for it there),
    seen at loop time ``now``: a loop time later than ``now``, or None to claim
    now. A due time at or before ``now`` may count as served already (by a claim
    that began after it: :meth:`~._wakeup.Wakeup.claiming`), so an opening closer
    than the wake-up's lead is claimed at once: with ``at`` the claim then waits
    for it on the server.

    - Without ``at``: at the opening itself (never early: the claim would find no
      room yet), or now once it has come.
    - With ``at``: ``lead`` before it, or now when that is past.

    Pure: plain floats in (property-tested, tests/test_openings.py)."""
    due = when if at is None else when - lead
    return due if due > now else None


class Openings:
    """The start-rate windows one queue's claim loop waits for."""

    def __init__(self, queue: str, settings: Settings, connections: Connections,
                 wakeup: Wakeup) -> None:
        self._queue = queue
        self._settings = settings
        self._connections = connections
        self._wakeup = wakeup
        self._clock = ServerClock()
        self._claimed_open = False  # claimed again for a window found open (_next)
        #: The window waited for: its opening in loop time and in the server's clock.
        self._window: tuple[float, datetime] | None = None

    async def learn(self, keys: tuple[str, ...]) -> bool:
        """The claim left ``keys`` without room: wake the loop for the soonest of
        their start-rate windows (WINDOW_LEAD early, see the module). True when one
        is open already, or opens sooner than that: claim again now
        (:func:`next_wake`)."""
        loop = asyncio.get_running_loop()
        try:
            opens = await self._next(keys)
        except Exception as exc:  # the poll still finds the window open
            logger.debug("could not read when the start-rate windows open: %s", exc)
            return False
        if opens is None:
            return False
        when, at = opens
        wake = next_wake(when, at, loop.time())
        if at is not None:
            self._window = (when, at)
        if wake is None:
            return True
        self._wakeup.due_at(self._queue, wake, margin=0.0)
        return False

    def claim_for(self) -> datetime | None:
        """The opening (server clock) the claim about to be sent waits for: the
        window's, when it is WINDOW_EARLY away or less (or past). None for any
        other claim (one woken early by something else does not wait). Either way
        the window is forgotten: the claim learns the next one."""
        window, self._window = self._window, None
        if window is None:
            return None
        when, at = window
        if when - asyncio.get_running_loop().time() > WINDOW_EARLY:
            return None
        return at

    async def _next(self, keys: tuple[str, ...]) -> tuple[float, datetime | None] | None:
        """The loop time at which the soonest start-rate window of ``keys`` opens,
        and the same moment of the server's clock (None with an injected clock, or
        for a window open already); None: none of them is held by a start-rate
        limit."""
        loop = asyncio.get_running_loop()
        now = self._settings.sql_now()
        async with self._connections.claim_connection() as conn:
            cur = await conn.execute(queries.get("limit_next_start"), {
                "keys": Jsonb(list(keys)), "now": now})
            row = await cur.fetchone()
            received = loop.time()
        if row is None:
            return None
        if row[0] is None:
            # No window to wait for. One open already, with nothing else known to
            # hold its key: the claim came too early (the two clocks drifted). Claim
            # again now, once until a window is waited for again (something else may
            # hold the key after all: then the notification or the poll).
            if row[3] and not self._claimed_open:
                self._claimed_open = True
                return received, None
            return None
        self._claimed_open = False
        if now is not None:
            # An injected clock: its moments are not the server's; count from the
            # reply, as far as such a clock has a notion of waiting.
            return received + max(float(row[0]), 0.0), None
        self._clock.observed(received, float(row[2]))
        return self._clock.to_loop(float(row[1])), row[4]
