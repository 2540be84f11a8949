"""Hand-offs: the slot a run of a limited key leaves goes to the key's next job.

A key with ``max_running`` at its limit gets room only when one of its runs ends.
Without a hand-off, that room is used by the queue's next claim: the outcome is
written, the claim in flight (if any) ends, and the next one, sent after, starts
the key's next job; on a queue whose keys all run at their limit that is 2-3
claims' time (10-40 ms under load), during which the key has one run fewer than
its limit. With a hand-off the worker whose run ended starts the key's next job
itself, in the transaction that writes the outcome (``hand_off_lock`` and
``hand_off_take`` of ``handoff.sql``, sent with the finishes in one pipeline:
:func:`._finishes.write`'s ``then``): the key's limits row is locked without
waiting and its running jobs counted after the lock, as a claim does, so the
limit holds exactly, and the finish and the start commit together.

When: a run whose job has a limit key ends with an outcome to write (not a
give-back), in default order (fair order gives a freed slot to the group with the
fewest running, which a hand-off would not ask). The statement keeps queue order:
it starts the key's next job only when no queued job comes before it but jobs of
keys without room (those the queue's last claim left without room,
``ClaimLoop.blocked``, the keys handed off, and any key counted at its limit), as
far as a look at the first entries of the queue can tell (``hand_off_take``). So a
key with a deep backlog cannot keep a slot from an earlier job of another key that
has room: that slot goes to the next claim.
``Worker(hand_off=False)`` turns hand-offs off.

The slot is reserved from the run's end until the write is over (the claim loop
does not claim for it meanwhile: ``QueueSlots.reserved``); then the jobs started
go into the queue's claim loop like claimed jobs (``deliver``) and the reserved
slots are free again. A write that fails may have committed its hand-off unseen:
the queue's claim loop then reconciles before its next claim (``suspect``), as
after a failed claim; the retried write hands nothing off (its reservations are
gone).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .. import queries
from ..hooks import call_transition_hooks
from ..jobs import ClaimedJob, job_rows
from ..outcomes import GIVEN_BACK, Finish
from ._state import WorkerState

#: Told the jobs a hand-off started for a queue.
Deliver = Callable[[str, list[ClaimedJob]], None]


class HandOffs:
    """Reserved slots of ended runs, and the hand-off that uses them."""

    def __init__(self, state: WorkerState, *, blocked: Callable[[str], tuple[str, ...]],
                 deliver: Deliver, suspect: Callable[[str], None]) -> None:
        self._state = state
        self._settings = state.settings
        self._blocked = blocked
        self._deliver = deliver
        self._suspect = suspect
        #: job id -> (queue, key) of each ended run whose slot is reserved.
        self._reserved: dict[int, tuple[str, str]] = {}
        #: Held while a hand-off is in flight, from its write's start until its
        #: jobs are read (and by a claim loop that reconciles: the jobs of a
        #: hand-off in flight are nowhere in the worker yet). Taken after a
        #: connection, never before: the pools may be of one connection.
        self.quiet = asyncio.Lock()
        #: Jobs started by hand-offs since the worker started.
        self.started = 0

    @property
    def enabled(self) -> bool:
        settings = self._settings
        return settings.hand_off and not settings.fair

    def reserve(self, finish: Finish) -> None:
        """A run ended with ``finish`` to write: keep its slot for a hand-off when
        one may follow (see the module's doc)."""
        job, state = finish.job, self._state
        if (not self.enabled or job.limit_key is None or finish.kind == GIVEN_BACK
                or state.stopping or state.fenced or job.id in self._reserved
                or job.queue not in state.slots):
            return
        self._reserved[job.id] = (job.queue, job.limit_key)
        state.slots[job.queue].reserved += 1

    def reserved_in(self, batch: Sequence[Finish]) -> list[tuple[str, str]]:
        return [self._reserved[f.job.id] for f in batch if f.job.id in self._reserved]

    def release(self, batch: Sequence[Finish]) -> None:
        """The write of ``batch`` is over: its reserved slots are free again."""
        freed: set[str] = set()
        for finish in batch:
            held = self._reserved.pop(finish.job.id, None)
            if held is not None:
                self._state.slots[held[0]].reserved -= 1
                freed.add(held[0])
        for queue in freed:
            self._state.slots[queue].freed.set()

    def wanted(self, part: Sequence[Finish]) -> bool:
        """Whether writing ``part`` should start jobs in the slots it frees."""
        state = self._state
        return (not (state.stopping or state.fenced)
                and any(f.job.id in self._reserved for f in part))

    async def take_in(self, conn: psycopg.AsyncConnection[Any], part: Sequence[Finish]
                      ) -> Callable[[], Awaitable[list[ClaimedJob]]]:
        """Inside the transaction that writes ``part`` on ``conn``, after its
        finishes: send the statements that start the next jobs of the keys whose
        runs ended with a reserved slot; return what reads the jobs they started
        (and runs their on_transition hooks: then in the transaction still). What
        they raise rolls the write back (the flusher retries it, then without
        hand-offs: the reservations are gone). The caller holds :attr:`quiet`
        from before this until the jobs are read."""
        held = self.reserved_in(part)
        # One queue per key (room is counted per key, over every queue).
        asked: dict[str, tuple[str, int]] = {}
        for (queue, key), count in Counter(held).items():
            if key not in asked or count > asked[key][1]:
                asked[key] = (queue, count)
        keys = sorted(asked)
        excluded = set(keys)
        for queue in {queue for queue, _ in asked.values()}:
            excluded.update(self._blocked(queue))
        settings = self._settings
        params = {
            "queues": [asked[key][0] for key in keys],
            "keys": keys,
            "slots": [asked[key][1] for key in keys],
            "now": settings.sql_now(),
            "worker_id": settings.worker_id,
            "tasks": list(settings.task_names),
            "excluded": Jsonb(sorted(excluded)),
        }
        # Prepared at their first run on a connection, not after five: the take is a
        # long statement whose parse and plan cost more than its run for a few keys,
        # and the pool lends each write any of its connections, so each of them
        # pays that warm-up (with pgbouncer's transaction pooling nothing is
        # prepared: the pool's prepare_threshold is None).
        await conn.execute(queries.get("hand_off_lock"), {"keys": keys}, prepare=True)
        cur = await conn.cursor(row_factory=job_rows).execute(
            queries.get("hand_off_take"), params, prepare=True)

        async def read() -> list[ClaimedJob]:
            jobs = await cur.fetchall()
            hooks = settings.app.on_transition_hooks
            for job in jobs:
                await call_transition_hooks(hooks, conn, job, "queued", "running")
            return jobs

        return read

    def settle(self, batch: Sequence[Finish], started: list[ClaimedJob], *,
               failed: bool) -> None:
        """The write of ``batch`` is over: deliver the jobs its hand-offs started
        (committed), free its reserved slots; after a failure, the queues whose
        hand-offs may have committed unseen reconcile before their next claim."""
        if failed:
            for queue in {queue for queue, _ in self.reserved_in(batch)}:
                self._suspect(queue)
        by_queue: dict[str, list[ClaimedJob]] = {}
        for job in started:
            by_queue.setdefault(job.queue, []).append(job)
        self.started += len(started)
        for queue, jobs in by_queue.items():
            self._deliver(queue, jobs)
        self.release(batch)
