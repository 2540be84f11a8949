"""The claim loop of one queue: keep the queue's slots fed, then wait for work.

The loop claims while the queue's jobs run (one claim in flight at a time, on
the queue's claim connection; never waiting for outcome writes) and hands what it
claimed to ``start`` (the runner) as slots are free. It claims

- at once when a slot is idle and nothing waits to take it (as many jobs as
  there is room for), and
- ahead, when the room left is at least half the slots: claimed jobs then wait
  in a small buffer (claimed, not started) and start the moment a run ends, so
  a slot does not wait for a claim's round trip. How far ahead
  (:meth:`ClaimLoop.ahead`) follows the queue's runs: about as many as the
  slots finish during one claim, at most the slot count or, for runs :data:`FAR`
  times shorter than a claim, up to :data:`SHORT_RUNS_CLAIM` jobs per claim (a claim
  costs about a millisecond of fixed work on each side, so a queue of no-op
  jobs is claimed in large batches: 20 slots claim up to 512 jobs, not 40), and
  none while the queue's runs take long against a claim (a job must not wait
  here while another worker could run it) or while the queue's jobs have limit
  keys (a buffered job holds a place of its key's ``max_running``). A queue whose
  runs are much shorter than a claim (no-op jobs) waits up to half a claim's
  duration for the room to fill, so that each claim takes the most it may.
  When the runs turn longer, the buffer is cut back as runs end: the jobs
  claimed last that would wait longer than two claims and
  :data:`CUT_BACK_WAIT` at the slots' new pace (and beyond the slot count) are
  given back untouched (:meth:`ClaimLoop._cut_back`).

A buffered job is running in the database, claimed by this worker and covered
by its lease. It is given back, leaving no trace (it never started), when the
worker stops or fences itself (:meth:`ClaimLoop.give_back_buffered`), and a
cancellation request for it ends it as cancelled without running it.

A full claim is followed by another as soon as there is room; a short one means
the queue is drained for now, and the loop waits for its
:class:`~._wakeup.Wakeup` (a notification, the polling timer or a known due
time: a retry, a snooze, or the moment a start-rate window of a key the claim
left without room opens again). Idle, it looks before it claims: one lock-free
read (``worker_queue_ready``) says whether a claim might take or sweep anything,
and when it says no the loop waits again without claiming, so an idle poll or a
notification another worker served does not take the queue's claim turn. It
looks on every poll (not at a known due time), and on a notification when other live workers
serve the queue (whose wake-ups :class:`~._wakeup.Wakeup` spreads); never while
draining a backlog (after a full claim), nor after a failed claim (which
reconciles first). Claiming pauses while the worker is fenced and
while too many outcomes wait to be written (``backlogged``).

Listening, a loop whose claim came back short looks once more, right after it, only
to learn when the queue's next queued job becomes due (the look's ``due_in``): it
then waits for a notification or that due time, with a long safety poll
(``Settings.quiet_poll``), instead of polling every ``poll_interval``
(:class:`~._wakeup.Wakeup`). Not listening, it polls as before.

A claim that failed may have committed unseen (the reply was lost): before the
next claim of that queue, the loop reconciles, giving back the jobs of the queue
that the database says run here and that are neither running, buffered nor
pending (``known``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext

from .. import backoff, queries
from ..claim import claim, memory
from ..jobs import ClaimedJob, job_rows
from ._connections import Connections
from ._openings import Openings
from ._state import Run, WorkerState, wait_for
from ._wakeup import IDLE_EASING, Wakeup

logger = logging.getLogger("akadze.worker")

Start = Callable[[str, ClaimedJob], None]
HandBack = Callable[[ClaimedJob], None]

#: Weight of the newest sample in the moving averages of run and claim times.
SMOOTHING = 0.2
#: A queue whose claims take this many times its runs claims full batches.
SATURATED = 4
#: A queue whose runs are this many times shorter than its claims (runs that do
#: no I/O: a run that talks to the database is not; with many slots a no-op run
#: measures as long as the loop takes to run them all, 2.5 ms for 100 of them
#: against claims of 17 ms) claims far ahead ...
FAR = 5
#: ... up to this many jobs per claim (its slots and those claimed ahead), when
#: that is more than twice its slots.
#: Measured on 2 cores (no-op jobs, 20 slots, at load 6): claims of 40 jobs drained
#: 3 600 jobs/s, of 100 5 800, of 200 7 200, of 400 9 400; on the quiet host 5 400
#: with claims of 40, 12 200 with these (benchmarks/pipelined-worker.md).
SHORT_RUNS_CLAIM = 512
#: Seconds a job claimed ahead may wait for a slot (or two claims' time, when that
#: is longer) before it is given back for another worker: a bound that the noise of
#: a loaded host (no-op runs measured at a millisecond) does not reach.
CUT_BACK_WAIT = 0.25


class ClaimLoop:
    """Claims for one queue, and its buffer of claimed jobs not started yet."""

    def __init__(
        self,
        queue: str,
        state: WorkerState,
        connections: Connections,
        wakeup: Wakeup,
        *,
        start: Start,
        hand_back: HandBack,
        cancel_unstarted: HandBack,
        backlogged: Callable[[], bool],
        known: Callable[[], set[int]],
        quiet: Callable[[], AbstractAsyncContextManager[object]] = nullcontext,
    ) -> None:
        self.queue = queue
        self._state = state
        self._settings = state.settings
        self._slots = state.slots[queue]
        self._connections = connections
        self._wakeup = wakeup
        self._start = start
        self._hand_back = hand_back
        self._cancel_unstarted = cancel_unstarted
        self._backlogged = backlogged
        self._known = known
        self._quiet = quiet  # held while reconciling: no hand-off starts jobs meanwhile
        self._last_claim = 0.0  # loop time
        self._suspect = False  # a claim failed: its commit may have gone through unseen
        #: Claimed, not started yet, in claim order (dicts keep insertion order).
        self._buffer: dict[int, ClaimedJob] = {}
        self._run_time: float | None = None  # moving average, seconds
        self._claim_time: float | None = None
        self._keyed = False  # the last claim returned jobs with a limit key
        self._eager_since: float | None = None  # loop time: room to claim since then
        #: The keys the last claim of the queue left without room (what a hand-off
        #: may step over, :mod:`._handoffs`).
        self.blocked: tuple[str, ...] = ()
        #: The start-rate windows the loop waits for (:mod:`._openings`).
        self._openings = Openings(queue, state.settings, connections, wakeup)
        self._for_window = False  # the last claim was sent for a window's opening

    # -- what the worker sees -------------------------------------------------------------

    @property
    def _taken(self) -> int:
        """Slots and claimed jobs spoken for: runs, slots reserved for a hand-off,
        and jobs waiting in the buffer."""
        return self._slots.busy + self._slots.reserved + len(self._buffer)

    @property
    def free(self) -> int:
        """Slots that nothing runs in, nothing reserves and no buffered job waits for."""
        return max(0, self._settings.slots - self._taken)

    @property
    def ahead(self) -> int:
        """How many jobs the loop claims beyond the slots: about as many as the
        slots finish during one claim (the slots' count times a claim's duration
        over a run's), at most the slots' count or, for runs FAR times shorter
        than a claim, what SHORT_RUNS_CLAIM leaves beside them; none before a run
        ended, or while the queue's jobs have limit keys."""
        slots = self._settings.slots
        if self._keyed or self._run_time is None or self._claim_time is None:
            return 0
        if self._run_time * FAR <= self._claim_time:
            most = max(slots, SHORT_RUNS_CLAIM - slots)
        else:
            most = slots
        if self._run_time <= 0:
            return most
        return min(most, int(slots * self._claim_time / self._run_time))

    def buffered_ids(self) -> set[int]:
        return set(self._buffer)

    def give_back_buffered(self) -> list[int]:
        """Give back every buffered job (stop, fencing); return their ids."""
        jobs, self._buffer = list(self._buffer.values()), {}
        for job in jobs:
            self._hand_back(job)
        return [job.id for job in jobs]

    def cancel_buffered(self, job_id: int) -> bool:
        """A cancellation request for ``job_id``: when it waits here, end it as
        cancelled without running it (True)."""
        job = self._buffer.pop(job_id, None)
        if job is None:
            return False
        logger.info("job %d (%s): cancellation requested before it started", job.id, job.task,
                    extra={"job_id": job.id, "queue": self.queue})
        self._cancel_unstarted(job)
        return True

    async def claim(self, free: int) -> list[ClaimedJob]:
        """One claim of up to ``free`` jobs of the queue (not started)."""
        jobs, _ = await self._claim(free)
        return jobs

    def take_handed(self, jobs: list[ClaimedJob]) -> None:
        """Jobs a hand-off started for this queue (:mod:`._handoffs`): like claimed
        ones, into the buffer and the free slots; handed straight back during a
        stop or while fenced."""
        state = self._state
        if state.stopping or state.fenced:
            for job in jobs:
                self._hand_back(job)
            return
        for job in jobs:
            self._buffer[job.id] = job
        self._emit_claimed(jobs, detail="hand_off")
        self._fill()

    def suspect(self) -> None:
        """Something may have started jobs for this worker unseen (a hand-off whose
        reply was lost): reconcile before the next claim."""
        self._suspect = True

    def hand_over(self, jobs: list[ClaimedJob]) -> None:
        """Start ``jobs`` (just claimed) at once, and say so (``drain``)."""
        for job in jobs:
            self._start(self.queue, job)
        self._emit_claimed(jobs)

    # -- claiming ---------------------------------------------------------------------------

    async def _claim(self, free: int) -> tuple[list[ClaimedJob], tuple[str, ...]]:
        """Claim up to ``free`` jobs; also the keys the claim left without room
        (what the claim connection remembers for its next claim of the queue)."""
        settings = self._settings
        not_before = self._openings.claim_for()
        self._for_window = not_before is not None
        async with self._connections.claim_connection() as conn:
            jobs: list[ClaimedJob] = await claim(
                conn, queue=self.queue, slots=free, fair=settings.fair,
                worker_id=settings.worker_id, tasks=settings.task_names, app=settings.app,
                now=settings.sql_now(), durable=self._connections.durable_claims,
                not_before=not_before,
            )
            self.blocked = memory.get(conn, self.queue).blocked
        return jobs, self.blocked if len(jobs) < free else ()

    def _take(self, jobs: list[ClaimedJob]) -> None:
        """Jobs just claimed: into the buffer, then into the free slots."""
        if jobs:  # an empty claim says nothing of the queue's keys
            self._keyed = any(job.limit_key is not None for job in jobs)
        for job in jobs:
            self._buffer[job.id] = job
        self._emit_claimed(jobs, detail="window" if self._for_window else None)
        self._fill()

    def _emit_claimed(self, jobs: list[ClaimedJob], detail: str | None = None) -> None:
        events = self._state.events
        if jobs and events.wanted:
            events.emit("claimed", queue=self.queue, job_ids=[job.id for job in jobs],
                        detail=detail)

    def _fill(self) -> None:
        """Start buffered jobs in the free slots (not while stopping or fenced)."""
        state, slots, buffer = self._state, self._slots, self._buffer
        while buffer and slots.busy < self._settings.slots and not (
                state.stopping or state.fenced):
            job_id = next(iter(buffer))
            job = buffer.pop(job_id)
            self._start(self.queue, job)
            run = state.running.get(job_id)
            if run is not None and run.aio is not None:
                run.aio.add_done_callback(functools.partial(self._ended, run))

    def _ended(self, run: Run, _task: object) -> None:
        took = asyncio.get_running_loop().time() - run.started
        self._run_time = _average(self._run_time, took)
        self._fill()
        if len(self._buffer) > self._settings.slots:
            self._cut_back()

    def _cut_back(self) -> None:
        """The runs turned longer than when the buffer was filled: give back,
        untouched, the jobs claimed last that would wait here longer than two
        claims and CUT_BACK_WAIT (at the slots' current pace; never below the
        slot count), so that they do not wait while another worker could run
        them."""
        run, took, slots = self._run_time, self._claim_time, self._settings.slots
        if run is None or took is None or run <= 0 or self._state.stopping:
            return
        keep = max(slots, int(slots * max(2 * took, CUT_BACK_WAIT) / run))
        if len(self._buffer) <= keep:
            return
        ids = list(self._buffer)[keep:]
        for job_id in ids:
            self._hand_back(self._buffer.pop(job_id))
        logger.debug("queue %s: runs turned longer; %d jobs claimed ahead given back",
                     self.queue, len(ids), extra={"queue": self.queue})
        self._state.events.emit("cut_back", queue=self.queue, job_ids=ids)

    def _room(self) -> int:
        return self._settings.slots + self.ahead - self._taken

    def _full(self) -> int:
        """The room a saturated queue waits for: all it may claim or, claiming far
        ahead (more than its slots), half of it. A claim of a few hundred jobs
        costs little more per job than one of twice as many, and sent while half
        the buffer is still there it is back before the slots run dry."""
        slots, ahead = self._settings.slots, self.ahead
        return slots + ahead if ahead <= slots else (slots + ahead) // 2

    def _saturated(self) -> bool:
        """The queue's runs are much shorter than a claim: its slots empty in a
        fraction of a claim's round trip, however early the claim is sent, and the
        jobs per claim are what bounds the rate."""
        run, took = self._run_time, self._claim_time
        return (self.ahead >= self._settings.slots and run is not None and took is not None
                and run * SATURATED <= took)

    def _wait(self) -> float | None:
        """How long to wait for a run to end before claiming; None: claim now.

        A claim is sent when a slot is idle with no job to take, or when the room
        left is half the slots or more. When the queue is saturated it waits a
        little for the room to fill (:meth:`_full`; half a claim's duration at
        most), so that each claim takes the most it may."""
        self._fill()  # a run may have ended just now: its slot first takes a buffered job
        settings = self._settings
        if self._state.fenced or self._backlogged():
            return settings.poll_interval
        room = self._room()
        if room <= 0 or not (self.free > 0 or room >= max(1, settings.slots // 2)):
            self._eager_since = None
            return settings.poll_interval
        if room >= self._full() or not self._saturated():
            return None
        now = asyncio.get_running_loop().time()
        if self._eager_since is None:
            self._eager_since = now
        left = self._eager_since + (self._claim_time or 0.0) / 2 - now
        return None if left <= 0 else left

    def _stopping(self) -> bool:
        return self._state.stopping

    async def run(self) -> None:
        state = self._state
        while not state.registered.is_set():
            if state.stopping:
                return
            await wait_for(state.registered, 0.5)
        try:
            await self._loop()
        finally:
            self.give_back_buffered()

    async def _loop(self) -> None:
        state, wakeup = self._state, self._wakeup
        loop = asyncio.get_running_loop()
        where = f"claim on queue {self.queue!r}"
        # Whether the loop is idle: its last claim came back short (or it has not
        # claimed yet), so it looks (worker_queue_ready) before it claims again. A
        # full claim clears it: a backlog is drained claim after claim, unchecked.
        idle = True
        while not state.stopping:
            wait = self._wait()
            if wait is not None:
                self._slots.freed.clear()
                await wait_for(self._slots.freed, wait)
                continue
            self._eager_since = None
            notified = wakeup.notified(self.queue)
            wakeup.consume(self.queue)
            if idle and not self._suspect and self._should_look(notified):
                ready = await self._looks_ready()
                if ready is None:  # the look failed (and backed off): look again
                    continue
                if not ready:
                    # Nothing a claim could take or sweep: no claim, no turn.
                    IDLE_EASING.skipped += 1
                    if not wakeup.notified(self.queue):
                        state.events.emit("idle", queue=self.queue)
                    await self._idle_wait()
                    continue
            room = self._room()
            if room <= 0:
                # taken meanwhile (the look above awaited): a reserved job begun in the
                # slot of a run whose task has not ended yet counts once more until it
                # does (see _handoffs)
                continue
            began = loop.time()
            wakeup.claiming(self.queue)
            IDLE_EASING.claims += 1
            try:
                if self._suspect:
                    await self._reconcile()
                jobs, blocked = await self._claim(room)
            except Exception as exc:
                self._suspect = True
                if state.stopping:
                    return
                await self._back_off(where, exc)
                continue
            state.trouble.recovered(where)
            self._last_claim = loop.time()
            self._claim_time = _average(self._claim_time, self._last_claim - began)
            if state.stopping:  # claimed during a stop: hand them straight back
                for job in jobs:
                    self._hand_back(job)
                return
            self._take(jobs)
            idle = len(jobs) < room
            if not idle:
                # The queue may hold more: claim again as soon as there is room; one
                # pass of the loop lets every run that is finishing now finish first.
                await asyncio.sleep(0)
                continue
            # Drained: wait for a notification (new jobs, or room for a limited key),
            # the polling timer or a known due time (such as the moment a start-rate
            # window of a key the claim left without room opens).
            if blocked and await self._openings.learn(blocked):
                continue  # a window is open already: claim again, not wait
            if (IDLE_EASING.look_first and wakeup.waits_long()
                    and not wakeup.notified(self.queue)):
                # Learn when the next queued job is due, to wait for it rather than
                # poll. A look that says ready (a job this claim did not take) gives
                # no due time: the loop then polls, as it did.
                await self._looks_ready()
            if not wakeup.notified(self.queue):
                state.events.emit("idle", queue=self.queue)
            await self._idle_wait()

    async def _back_off(self, where: str, exc: Exception) -> None:
        """Report a failed claim or look as trouble and wait before the next try
        (reconnect_delay, by how often ``where`` failed in a row)."""
        state = self._state
        delay = backoff.reconnect_delay(state.trouble.failures(where) + 1,
                                        state.random.random())
        state.trouble.failed(where, exc, delay)
        await state.sleep(delay)

    async def _idle_wait(self) -> None:
        """Wait for a reason to look again; after a notification, let a burst land
        and take this worker's share of the spread over the queue's peers."""
        wakeup = self._wakeup
        await wakeup.wait(self.queue, self._stopping)
        if not self._state.stopping and wakeup.notified(self.queue):
            await wakeup.debounce(self.queue, self._last_claim)

    def _should_look(self, notified: bool) -> bool:
        """Whether an idle loop asks worker_queue_ready before it claims. Always on a
        poll; never at a known due time (a retry or snooze of this worker's, or a
        start-rate window of a key its claim left without room: work it knows of,
        which a look would only delay by a round trip); on a notification only
        beside peers (alone, the turn is nobody else's and the look would only add a
        round trip before the job starts), or when the count of peers is due for a
        refresh."""
        if not IDLE_EASING.look_first:
            return False
        wakeup = self._wakeup
        if not notified and wakeup.woke_at_due_time(self.queue):
            return False
        return not notified or wakeup.peers(self.queue) > 1 or wakeup.peers_stale(self.queue)

    async def _looks_ready(self) -> bool | None:
        """worker_queue_ready: whether a claim might take or sweep anything now (never
        False when it would). None when the look failed: reported as trouble, after
        a backoff (no claim meanwhile: it would meet the same trouble, and take the
        turn while it does)."""
        state, wakeup = self._state, self._wakeup
        where = f"look at queue {self.queue!r}"
        peers = wakeup.peers_stale(self.queue)
        IDLE_EASING.looks += 1
        try:
            async with self._connections.claim_connection() as conn:
                cur = await conn.execute(queries.get("worker_queue_ready"), {
                    "queue": self.queue, "now": self._settings.sql_now(), "peers": peers})
                row = await cur.fetchone()
        except Exception as exc:
            wakeup.unsure(self.queue)
            if state.stopping:
                return None
            await self._back_off(where, exc)
            return None
        state.trouble.recovered(where)
        if row is None:
            wakeup.unsure(self.queue)
            return True
        if row[1] is not None:
            wakeup.set_peers(self.queue, int(row[1]))
        ready = bool(row[0])
        wakeup.looked(self.queue, ready, None if row[2] is None else float(row[2]))
        return ready

    async def _reconcile(self) -> None:
        """Give back the jobs a lost claim reply left running for this worker.

        Runs in the queue's own loop, so no claim of this queue is in flight: a job
        of the queue running for this worker that is neither running here, buffered
        nor waiting for its outcome to be written was claimed unseen (or started by
        a hand-off whose reply was lost). No hand-off runs meanwhile (``quiet``): one
        in flight would have started jobs that are nowhere here yet."""
        async with self._connections.connection() as conn, self._quiet():
            cur = await conn.cursor(row_factory=job_rows).execute(
                queries.get("worker_running_in_queue"),
                {"worker_id": self._settings.worker_id, "queue": self.queue},
            )
            jobs = await cur.fetchall()
            known = self._known() | set(self._buffer)
        for job in jobs:
            if job.id not in known:
                logger.warning(
                    "job %d: claimed by a claim whose reply was lost; giving it back",
                    job.id, extra={"job_id": job.id, "queue": self.queue})
                self._hand_back(job)
        self._suspect = False


def _average(current: float | None, sample: float) -> float:
    return sample if current is None else current + SMOOTHING * (sample - current)
