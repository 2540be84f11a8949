"""The claim loop of one queue: fill the queue's free slots, then wait for work.

Each pass claims as many jobs as the queue has free slots (one claim call, see
:func:`akadze.claim.claim`) and hands them to ``start`` (the runner). A full claim
is followed by another as soon as slots free up; a short one means the queue is
drained for now, and the loop waits for its :class:`~._wakeup.Wakeup` (a
notification, the polling timer or a known due time). Claiming pauses while the
queue's slots are all taken, while the worker is fenced, and while too many
outcomes wait to be written (``backlogged``).

A claim that failed may have committed unseen (the reply was lost): before the
next claim of that queue, the loop reconciles, giving back the jobs of the queue
that the database says run here and that are neither running nor pending
(``known``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .. import backoff, queries
from ..claim import claim
from ..jobs import ClaimedJob, job_rows
from ._connections import Connections
from ._state import WorkerState, wait_for
from ._wakeup import Wakeup

logger = logging.getLogger("akadze.worker")

Start = Callable[[str, ClaimedJob], None]
HandBack = Callable[[ClaimedJob], None]


class ClaimLoop:
    """Claims for one queue."""

    def __init__(
        self,
        queue: str,
        state: WorkerState,
        connections: Connections,
        wakeup: Wakeup,
        *,
        start: Start,
        hand_back: HandBack,
        backlogged: Callable[[], bool],
        known: Callable[[], set[int]],
    ) -> None:
        self.queue = queue
        self._state = state
        self._settings = state.settings
        self._slots = state.slots[queue]
        self._connections = connections
        self._wakeup = wakeup
        self._start = start
        self._hand_back = hand_back
        self._backlogged = backlogged
        self._known = known
        self._last_claim = 0.0  # loop time
        self._suspect = False  # a claim failed: its commit may have gone through unseen

    @property
    def free(self) -> int:
        return self._settings.slots - self._slots.busy

    async def claim(self, free: int) -> list[ClaimedJob]:
        """One claim of up to ``free`` jobs of the queue (not started)."""
        settings = self._settings
        async with self._connections.claim_connection() as conn:
            jobs: list[ClaimedJob] = await claim(
                conn, queue=self.queue, slots=free, fair=settings.fair,
                worker_id=settings.worker_id, tasks=settings.task_names, app=settings.app,
                now=settings.sql_now(), durable=self._connections.durable_claims,
            )
        return jobs

    def hand_over(self, jobs: list[ClaimedJob]) -> None:
        """Hand ``jobs`` (just claimed) to the runner, and say so."""
        for job in jobs:
            self._start(self.queue, job)
        events = self._state.events
        if jobs and events.wanted:
            events.emit("claimed", queue=self.queue, job_ids=[job.id for job in jobs])

    def _blocked(self) -> bool:
        return self._slots.busy >= self._settings.slots or self._state.fenced or self._backlogged()

    def _stopping(self) -> bool:
        return self._state.stopping

    async def run(self) -> None:
        state, slots, wakeup = self._state, self._slots, self._wakeup
        loop = asyncio.get_running_loop()
        where = f"claim on queue {self.queue!r}"
        while not state.registered.is_set():
            if state.stopping:
                return
            await wait_for(state.registered, 0.5)
        while not state.stopping:
            if self._blocked():
                slots.freed.clear()
                await wait_for(slots.freed, self._settings.poll_interval)
                continue
            wakeup.consume(self.queue)
            free = self.free
            try:
                if self._suspect:
                    await self._reconcile()
                jobs = await self.claim(free)
            except Exception as exc:
                self._suspect = True
                if state.stopping:
                    return
                delay = backoff.reconnect_delay(state.trouble.failures(where) + 1,
                                                state.random.random())
                state.trouble.failed(where, exc, delay)
                await state.sleep(delay)
                continue
            state.trouble.recovered(where)
            self._last_claim = loop.time()
            if state.stopping:  # claimed during a stop: hand them straight back
                for job in jobs:
                    self._hand_back(job)
                return
            self.hand_over(jobs)
            if len(jobs) >= free:
                # The queue may hold more: claim again as soon as slots free up; one
                # pass of the loop lets every run that is finishing now finish first.
                await asyncio.sleep(0)
                continue
            # Drained: wait for a notification, the polling timer or a known due time.
            if not wakeup.notified(self.queue):
                state.events.emit("idle", queue=self.queue)
            await wakeup.wait(self.queue, self._stopping)
            if not state.stopping and wakeup.notified(self.queue):
                await wakeup.debounce(self._last_claim)

    async def _reconcile(self) -> None:
        """Give back the jobs a lost claim reply left running for this worker.

        Runs in the queue's own loop, so no claim of this queue is in flight: a job
        of the queue running for this worker that is neither running here nor
        waiting for its outcome to be written was claimed unseen."""
        async with self._connections.connection() as conn:
            cur = await conn.cursor(row_factory=job_rows).execute(
                queries.get("worker_running_in_queue"),
                {"worker_id": self._settings.worker_id, "queue": self.queue},
            )
            jobs = await cur.fetchall()
        known = self._known()
        for job in jobs:
            if job.id not in known:
                logger.warning(
                    "job %d: claimed by a claim whose reply was lost; giving it back",
                    job.id, extra={"job_id": job.id, "queue": self.queue})
                self._hand_back(job)
        self._suspect = False
