"""Wake-up: when a queue's claim loop looks again.

Notifications come from the :class:`~._listener.Listener`: whenever it (re)connects
the worker looks at every queue once, since notifications sent while nobody listened
are lost. A queue's notification makes its claim loop claim, which takes only what
the database holds as ready: a notification is a hint, never an order.

:class:`Wakeup` holds each queue's reasons to look again: a notification, the
polling timer (``poll_interval``, jittered; it keeps working without LISTEN,
which cannot work behind PgBouncer in transaction pooling mode and which
``listen=False`` turns off), and the known due times of jobs this worker retried
or snoozed.

Listening, a claim loop whose last look (``worker_queue_ready``) found nothing ready
does not poll every ``poll_interval``: it waits for a notification, the next due
time the look returned (:meth:`Wakeup.looked`; the moment the queue's next queued
job becomes due), or the safety poll ``Settings.quiet_poll`` (10 x poll_interval,
at most 30 s). Nothing becomes claimable without one of them: every statement that
leaves a job queued notifies (enqueues, scheduled ones included, retries, snoozes,
rescues, requeues, resume, a limited key getting room), what is queued already has
its due time, and a start-rate window is learnt by the claim it held back
(``limit_next_start``). A look that says ready (a job a claim then does not take:
another task's, a key without room) gives no due time, so the loop polls as before.
When the listener loses its connection, the waits are re-timed to ``poll_interval``
(:meth:`Wakeup.retime_all`); when it is back, every queue is looked at. A due time
learnt by a look is shared by every worker of the queue: it wakes the loop like a
notification (spread over the peers, looked at first), not like a due time of this
worker's own.

A notification reaches every worker of the queue at once. Alone on its queue, a
worker claims after :data:`DEBOUNCE`, as it always did. Beside ``peers - 1`` other
live workers of the queue (as the database's ``akadze.workers`` says: the claim
loop's ready check brings the count, every :data:`PEERS_EVERY` seconds), each waits
a random delay first (:func:`wake_delay`: uniform over a window of
:data:`SPREAD_PER_PEER` per peer, at most :data:`SPREAD_MAX` and a quarter of
``poll_interval``), so the first of them claims while the later ones' ready check
(``worker_queue_ready``) already finds the job gone and takes no turn. The first of
``n`` uniform draws comes after about window / n, so a job still waits about
:data:`SPREAD_PER_PEER` for the earliest of them, however many there are.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Cap on a claim loop's wait after a notification, to batch a burst of enqueues.
DEBOUNCE = 0.002
#: The spread of the wake-ups of the workers of one queue, per live peer ...
SPREAD_PER_PEER = 0.002
#: ... at most this long (and at most a quarter of poll_interval).
SPREAD_MAX = 0.25
#: Seconds after which a claim loop asks again how many live workers serve its queue.
PEERS_EVERY = 10.0
#: How long after a retry's or snooze's due time its claim loop wakes: the row's
#: run_at was computed by the server from its own clock, no later than that.
DUE_MARGIN = 0.001
#: How long before a known due time its wait stops sleeping and starts yielding.
DUE_LEAD = 0.0015


async def _yield_until(end: float, interrupted: Callable[[], bool]) -> None:
    """Yield to the loop until its time reaches ``end`` or ``interrupted()``."""
    loop = asyncio.get_running_loop()
    while loop.time() < end and not interrupted():  # noqa: ASYNC110 (on purpose)
        await asyncio.sleep(0)


@dataclass(slots=True)
class IdleEasing:
    """What keeps idle workers off their queue's claim turn; both on by default.
    A harness switch (``akadze bench idle`` turns both off in its idle workers to
    compare): applications have no reason to touch it.

    ``look_first``: an idle claim loop asks ``worker_queue_ready`` (no lock, no
    turn) before it claims; ``spread``: wake-ups after a notification are spread
    over the queue's peers (:func:`wake_delay`). The counters say what the claim
    loops of this process did: ``claims`` made (each took its queue's turn),
    ``looks`` made, and how many of those looks found nothing (``skipped``: a claim
    not made)."""

    look_first: bool = True
    spread: bool = True
    claims: int = 0
    looks: int = 0
    skipped: int = 0


#: The switches every worker of this process reads.
IDLE_EASING = IdleEasing()


def wake_delay(peers: int, draw: float, poll_interval: float) -> float:
    """Seconds a worker waits after a notification before it looks, beside ``peers``
    live workers of the queue (itself included), for a ``draw`` in [0, 1).

    None alone (``peers`` <= 1); else ``draw`` times a window that grows by
    SPREAD_PER_PEER per peer beyond the first, capped at SPREAD_MAX and at a quarter
    of ``poll_interval`` (a notification must never wait as long as a poll would).
    Pure: the worker passes ``random.random()``."""
    if peers <= 1:
        return 0.0
    window = min(SPREAD_PER_PEER * (peers - 1), SPREAD_MAX, poll_interval / 4)
    return max(0.0, min(draw, 1.0)) * window

@dataclass(slots=True)
class _Signals:
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # notified: look now
    retimer: asyncio.Event = field(default_factory=asyncio.Event)  # an earlier due time
    due: list[float] = field(default_factory=list)  # heap of loop times of known run_at
    by_due: bool = False  # the last wait ended at a known due time
    quiet: bool = False  # the last look found nothing ready: listening, wait long
    expected: float | None = None  # loop time: the queue's next job is due, as looked
    claimed: float = float("-inf")  # loop time the queue's last claim began


class Wakeup:
    """Each queue's reasons to claim again (used by its claim loop)."""

    def __init__(self, queues: Sequence[str], *, poll_interval: float,
                 rand: random.Random, quiet_poll: float | None = None,
                 listening: Callable[[], bool] = lambda: False) -> None:
        self._signals = {name: _Signals() for name in queues}
        self._poll_interval = poll_interval
        self._quiet_poll = quiet_poll
        self._listening = listening
        self._random = rand
        #: Live workers of each queue (this one included) and the loop time it was
        #: learnt; unknown until the first ready check brings it.
        self._peers: dict[str, tuple[int, float]] = {}

    def notify(self, queue: str) -> None:
        """Jobs of ``queue`` became ready (a notification); unknown queues are ignored."""
        signals = self._signals.get(queue)
        if signals is not None:
            signals.wake.set()

    def notify_all(self) -> None:
        for signals in self._signals.values():
            signals.wake.set()

    def due_at(self, queue: str, when: float, margin: float = DUE_MARGIN) -> None:
        """A job of ``queue`` becomes ready at loop time ``when`` (a retry or a
        snooze written just now: the row's run_at is no later than that), waited
        for until ``margin`` after it."""
        signals = self._signals.get(queue)
        if signals is None:
            return
        heapq.heappush(signals.due, when + margin)
        if signals.due[0] == when + margin:
            signals.retimer.set()  # earlier than what the queue's loop waits for

    def looked(self, queue: str, ready: bool, due_in: float | None) -> None:
        """A look at ``queue`` said whether anything is ready and, when not, in how
        many seconds its next queued job becomes due (None: no queued job). Only a
        loop that waits long (listening) waits for that due time; a polling one
        finds the job at a poll, as it always did."""
        signals = self._signals[queue]
        signals.quiet = not ready
        signals.expected = None
        if not ready and due_in is not None and self.waits_long():
            signals.expected = asyncio.get_running_loop().time() + max(due_in, 0.0)

    def claiming(self, queue: str) -> None:
        """A claim of ``queue`` begins now: what the last look said no longer holds
        (:meth:`unsure`), and the claim serves every due time up to now. A due time
        that comes while it runs is not served by it (the job was not ready yet) and
        still wakes the loop, however soon after (:meth:`_poll_timeout`)."""
        self.unsure(queue)
        self._signals[queue].claimed = asyncio.get_running_loop().time()

    def unsure(self, queue: str) -> None:
        """What the last look said no longer holds (a failed look, a claim): poll."""
        signals = self._signals[queue]
        signals.quiet = False
        signals.expected = None

    def waits_long(self) -> bool:
        """Whether a quiet loop waits for the safety poll (listening, with one)."""
        return self._quiet_poll is not None and self._listening()

    def retime_all(self) -> None:
        """The listener lost its connection: every wait is timed again (polling)."""
        for signals in self._signals.values():
            signals.retimer.set()

    def notified(self, queue: str) -> bool:
        return self._signals[queue].wake.is_set()

    def consume(self, queue: str) -> None:
        """The claim loop is about to claim: what woke it is being served."""
        self._signals[queue].wake.clear()

    async def wait(self, queue: str, stopping: Callable[[], bool]) -> None:
        """Wait for a notification, the polling timer, the earliest known due time
        (which may move earlier while waiting) or the due time a look returned (which
        then counts as a notification)."""
        signals = self._signals[queue]
        loop = asyncio.get_running_loop()
        signals.by_due = False
        while not signals.wake.is_set() and not stopping():
            signals.retimer.clear()
            timeout, why = self._poll_timeout(signals)
            began = loop.time()
            # A known due time is waited for to the tenth of a millisecond: the
            # loop's timers fire up to a millisecond late (epoll counts whole
            # milliseconds, rounded up), and a start-rate window opened late opens
            # the next one late too. So the wait ends DUE_LEAD early and the rest
            # is spent yielding to the loop (CPU for about that long, once per due
            # time).
            lead = min(DUE_LEAD, timeout) if why == "due" else 0.0
            waits = [asyncio.ensure_future(signals.wake.wait()),
                     asyncio.ensure_future(signals.retimer.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout - lead,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            if lead:
                await _yield_until(began + timeout, lambda: (
                    stopping() or signals.wake.is_set() or signals.retimer.is_set()))
            timed_out = loop.time() - began >= timeout
            if signals.retimer.is_set() and not timed_out:
                continue
            if timed_out and not signals.wake.is_set():
                if why == "due":
                    signals.by_due = True
                elif why == "expected":
                    signals.expected = None
                    signals.wake.set()
            return

    def woke_at_due_time(self, queue: str) -> bool:
        """Whether the last wait of ``queue`` ended at a known due time (a retry or a
        snooze of this worker's, or a start-rate window opening): work this worker
        knows of, not a poll's guess."""
        return self._signals[queue].by_due

    def _poll_timeout(self, signals: _Signals) -> tuple[float, str]:
        """How long to wait, and what ends it: "poll", "due" (a known due time of
        this worker's) or "expected" (the due time the last look returned)."""
        now = asyncio.get_running_loop().time()
        interval = self._poll_interval
        if signals.quiet and self.waits_long():
            interval = self._quiet_poll or interval
        timeout, why = interval * self._random.uniform(0.8, 1.2), "poll"
        # Served: the due times a claim began after. One that came since the last
        # claim began, even if it is past now (it came during that claim, or while
        # the loop did something else), wakes the loop at once.
        while signals.due and signals.due[0] <= signals.claimed:
            heapq.heappop(signals.due)
        # due_at added the 1 ms margin already (one margin, not two).
        if signals.due and signals.due[0] - now < timeout:
            timeout, why = max(signals.due[0] - now, 0.0), "due"
        expected = signals.expected
        if expected is not None and expected - now + 0.001 < timeout:
            timeout, why = expected - now + 0.001, "expected"
        return max(timeout, 0.0), why

    def set_peers(self, queue: str, peers: int) -> None:
        """``peers`` live workers serve ``queue`` (this one included), as of now."""
        self._peers[queue] = (max(1, peers), asyncio.get_running_loop().time())

    def peers(self, queue: str) -> int:
        """How many live workers serve ``queue``, as last learnt (1 until known)."""
        known = self._peers.get(queue)
        return 1 if known is None else known[0]

    def peers_stale(self, queue: str) -> bool:
        """Whether the count of ``queue``'s peers is unknown or PEERS_EVERY old."""
        known = self._peers.get(queue)
        return known is None or asyncio.get_running_loop().time() - known[1] >= PEERS_EVERY

    async def debounce(self, queue: str, last_claim: float) -> None:
        """After a notification: let a burst of enqueues land (DEBOUNCE since the last
        claim) and, beside peers, wait this worker's share of the spread
        (:func:`wake_delay`), whichever is longer."""
        gap = DEBOUNCE - (asyncio.get_running_loop().time() - last_claim)
        if IDLE_EASING.spread:
            gap = max(gap, wake_delay(self.peers(queue), self._random.random(),
                                      self._poll_interval))
        if gap > 0:
            await asyncio.sleep(gap)
