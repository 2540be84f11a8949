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

Reservations: the transaction of a hand-off also reserves, for each run of a key
it starts, the key's next job (state ``reserved``, held for this worker with the
token its run will carry). When a run of that key ends here, the reserved job
starts at once, without waiting for any write; the write that records the run's
end starts it in the database too (``start_reserved``, fenced by the reservation,
after the finish: the key's count goes down and up again under the lock the
finish took) and reserves the next one. So a key at its limit loses no time
between its runs but the event loop's. A reservation given back meanwhile (the
job was cancelled, or rescued after this worker's lease ran out) is not started:
that run is stopped as lost. The worker gives back what it holds when it stops
(``worker_unregister``); a lost worker's are given back by the rescue.

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
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .. import queries
from ..hooks import call_transition_hooks
from ..jobs import ClaimedJob, JobState, job_state_rows
from ..outcomes import GIVEN_BACK, Finish
from ._state import WorkerState

#: Told the jobs a hand-off started for a queue.
Deliver = Callable[[str, list[ClaimedJob]], None]
#: Told the runs to stop as lost (job ids, why).
Lose = Callable[[list[int], str], object]

#: Seconds a reservation is held at most. It saves its key's slot one outcome write
#: (5-15 ms on a busy worker): worth it for short runs, next to nothing for runs of
#: seconds. And while it waits for a long run to end, another worker's slot of the
#: key that frees finds no queued job when the reserved one is the key's last. So a
#: reservation whose run is not over after this long goes back to the queue.
HOLD = 1.0


@dataclasses.dataclass
class Took:
    """What the hand-off statements of one write did: the jobs they started, the
    jobs they reserved, and the ids of the reserved jobs they started (the ones
    begun here when a run ended)."""

    started: list[ClaimedJob] = dataclasses.field(default_factory=list)
    reserved: list[ClaimedJob] = dataclasses.field(default_factory=list)
    confirmed: set[int] = dataclasses.field(default_factory=set)
    gave_back: bool = False
    #: The start_reserved cursor, read with the rest.
    begun: Any = None


class HandOffs:
    """Reserved slots of ended runs, and the hand-off that uses them."""

    def __init__(self, state: WorkerState, *, blocked: Callable[[str], tuple[str, ...]],
                 deliver: Deliver, suspect: Callable[[str], None],
                 lose: Lose | None = None) -> None:
        self._state = state
        self._settings = state.settings
        self._blocked = blocked
        self._deliver = deliver
        self._suspect = suspect
        self._lose = lose
        #: job id -> (queue, key) of each ended run whose slot is reserved.
        self._reserved: dict[int, tuple[str, str]] = {}
        #: (queue, key) -> the jobs reserved for this worker, in queue order.
        self._successors: dict[tuple[str, str], list[ClaimedJob]] = {}
        #: job id of an ended run -> the reserved job started in its slot, until a
        #: write has started it in the database.
        self._carried: dict[int, ClaimedJob] = {}
        #: A write failed after it may have reserved jobs unseen: the next one
        #: gives back those this worker does not know of.
        self._unsure = False
        #: job id of a reserved job -> loop time when it goes back (HOLD).
        self._until: dict[int, float] = {}
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
        """A run ended with ``finish`` to write: start its key's reserved job in its
        slot, or keep the slot for a hand-off when one may follow (see the
        module's doc)."""
        job, state = finish.job, self._state
        if finish.kind == GIVEN_BACK and job.limit_key is not None:
            self.drop(job.queue, job.limit_key)
        if (not self.enabled or job.limit_key is None or finish.kind == GIVEN_BACK
                or state.stopping or state.fenced or job.id in self._reserved
                or job.id in self._carried or job.queue not in state.slots):
            return
        waiting = self._successors.get((job.queue, job.limit_key))
        if waiting:
            successor = waiting.pop(0)
            self._until.pop(successor.id, None)
            if not waiting:
                del self._successors[(job.queue, job.limit_key)]
            # as start_reserved will write it
            begun = dataclasses.replace(
                successor, run_count=successor.run_count + 1,
                attempt=successor.attempt + 1, worker_id=self._settings.worker_id,
                started_at=datetime.now(UTC))
            self._carried[job.id] = begun
            self.started += 1
            self._deliver(job.queue, [begun])
            return
        self._reserved[job.id] = (job.queue, job.limit_key)
        state.slots[job.queue].reserved += 1

    def next_expiry(self) -> float | None:
        """The loop time when the oldest reservation held here runs out."""
        return min(self._until.values(), default=None)

    def expire(self, now: float) -> None:
        """Let go of the reservations held since :data:`HOLD` (the next write, or
        :meth:`give_back`, gives them back)."""
        due = self.next_expiry()
        if due is None or due > now:
            return
        for key, jobs in list(self._successors.items()):
            kept = [job for job in jobs if self._until.get(job.id, now + 1) > now]
            if len(kept) < len(jobs):
                self._unsure = True
                if kept:
                    self._successors[key] = kept
                else:
                    del self._successors[key]
        followed = {job.id for jobs in self._successors.values() for job in jobs}
        self._until = {k: v for k, v in self._until.items() if k in followed}

    def forget(self) -> None:
        """Fenced: follow no reservation any more. The rescue gives them back if the
        lease runs out; if it is renewed, the next write (or :meth:`give_back`)
        does."""
        self._successors.clear()
        self._unsure = True

    def drop(self, queue: str, key: str | None) -> None:
        """A run of ``key`` ended here without an outcome that starts a successor
        (given back, lost): the next write gives back one reserved job of the key,
        so that no reservation outlives the runs it follows."""
        if key is None:
            return
        waiting = self._successors.get((queue, key))
        if waiting:
            waiting.pop()
            if not waiting:
                del self._successors[(queue, key)]
            self._unsure = True

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
        """Whether writing ``part`` should start jobs in the slots it frees (or
        start the reserved jobs begun in them already)."""
        state = self._state
        if any(f.job.id in self._carried for f in part):
            return True
        return (not (state.stopping or state.fenced)
                and (self._unsure or any(f.job.id in self._reserved for f in part)))

    def carried_keys(self, part: Sequence[Finish]) -> list[str]:
        """The keys of the reserved jobs begun in the slots of ``part``'s runs
        (empty: none was)."""
        return sorted({job.limit_key for f in part if (job := self._carried.get(f.job.id))
                       is not None and job.limit_key is not None})

    async def start_in(self, conn: psycopg.AsyncConnection[Any], part: Sequence[Finish],
                       took: Took) -> None:
        """Inside the transaction that writes ``part``, before its finishes (one of
        them may be of a job begun here: it must be running first), with the keys'
        limits rows locked: start the reserved jobs begun in the slots of its runs
        (start_reserved); :meth:`take_in`'s reader reads what it started."""
        carried = [self._carried[f.job.id] for f in part if f.job.id in self._carried]
        if carried:
            took.begun = await conn.execute(queries.get("start_reserved"), {
                "ids": [job.id for job in carried],
                "tokens": [job.claim_token for job in carried],
                "worker_id": self._settings.worker_id, "now": self._settings.sql_now(),
            }, prepare=True)

    async def take_in(self, conn: psycopg.AsyncConnection[Any], part: Sequence[Finish],
                      took: Took) -> Callable[[], Awaitable[Took]]:
        """Inside the transaction that writes ``part`` on ``conn``, after its
        finishes: send the statements that start the next jobs of the keys whose
        runs ended with a reserved slot; return what reads the jobs they started
        (and runs their on_transition hooks: then in the transaction still). What
        they raise rolls the write back (the flusher retries it, then without
        hand-offs: the reservations are gone). The caller holds :attr:`quiet`
        from before this until the jobs are read."""
        settings, state = self._settings, self._state
        carried = [self._carried[f.job.id] for f in part if f.job.id in self._carried]
        if self._unsure and not (state.stopping or state.fenced):
            await self.give_back(conn)  # settle says whether it committed
            took.gave_back = True
        held = self.reserved_in(part)
        # One queue per key (room is counted per key, over every queue): the
        # runs that ended with no successor ask for starts, those that began
        # their successor ask for its successor (none while stopping).
        asked: dict[str, tuple[str, int, int]] = {}
        for (queue, key), count in Counter(held).items():
            if key not in asked or count > asked[key][1]:
                asked[key] = (queue, count, 0)
        if not (state.stopping or state.fenced):
            for job in carried:
                limit_key = job.limit_key
                assert limit_key is not None
                queue, count, follow = asked.get(limit_key, (job.queue, 0, 0))
                asked[limit_key] = (queue, count, follow + 1)
        keys = sorted(asked)
        excluded = set(keys)
        for queue in {entry[0] for entry in asked.values()}:
            excluded.update(self._blocked(queue))
        params = {
            "queues": [asked[key][0] for key in keys],
            "keys": keys,
            "slots": [asked[key][1] for key in keys],
            "carried": [job.id for job in carried],
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
        cur = None
        if keys:
            await conn.execute(queries.get("hand_off_lock"), {"keys": keys}, prepare=True)
            cur = await conn.cursor(row_factory=job_state_rows).execute(
                queries.get("hand_off_take"), params, prepare=True)

        async def read() -> Took:
            if took.begun is not None:
                took.confirmed = {int(row[0]) for row in await took.begun.fetchall()}
                took.begun = None
            for job, job_state in ([] if cur is None else await cur.fetchall()):
                (took.started if job_state is JobState.RUNNING else took.reserved).append(job)
            hooks = settings.app.on_transition_hooks
            for job in took.started:
                await call_transition_hooks(hooks, conn, job, "queued", "running")
            for job in carried:
                if job.id in took.confirmed:
                    await call_transition_hooks(hooks, conn, job, "queued", "running")
            return took

        return read

    def settle(self, batch: Sequence[Finish], took: list[Took], *,
               failed: bool) -> None:
        """The write of ``batch`` is over: deliver the jobs its hand-offs started
        (committed), keep those they reserved, stop the reserved runs begun here
        that it could not start (their reservation was given back), free its
        reserved slots; after a failure, the queues whose hand-offs may have
        committed unseen reconcile before their next claim, and the next write
        gives back the reservations this worker does not know of."""
        if failed:
            self._unsure = True
            for queue in {queue for queue, _ in self.reserved_in(batch)}:
                self._suspect(queue)
        started = [job for one in took for job in one.started]
        if any(one.gave_back for one in took):
            self._unsure = failed
        confirmed = {job_id for one in took for job_id in one.confirmed}
        lost: list[int] = []
        for finish in batch:
            begun = None if failed else self._carried.pop(finish.job.id, None)
            if begun is not None and begun.id not in confirmed:
                lost.append(begun.id)
        if lost and self._lose is not None:  # the worker drops what followed them
            self._lose(lost, "its reservation was given back (cancelled or rescued)")
        for one in took:
            for job in one.reserved:
                if self._state.fenced or self._state.stopping:
                    # a write that landed late: nothing here follows them
                    self._unsure = True
                    continue
                assert job.limit_key is not None
                self._successors.setdefault((job.queue, job.limit_key), []).append(job)
                self._until[job.id] = asyncio.get_running_loop().time() + HOLD
        by_queue: dict[str, list[ClaimedJob]] = {}
        for job in started:
            by_queue.setdefault(job.queue, []).append(job)
        self.started += len(started)
        for queue, jobs in by_queue.items():
            self._deliver(queue, jobs)
        self.release(batch)
        self._trim()

    def _trim(self) -> None:
        """No more reserved jobs of a key than runs of it going here: a run that
        ended while the write that reserved its successor was in flight left that
        one with nothing to follow (it would wait here for a run of its key that
        may never come). The extra ones go back (:meth:`give_back`)."""
        if not self._successors:
            return
        going: Counter[tuple[str, str | None]] = Counter(
            (run.queue, run.job.limit_key) for run in self._state.running.values()
            if not run.recorded)
        for (queue, key), jobs in list(self._successors.items()):
            extra = len(jobs) - going[(queue, key)]
            if extra > 0:
                del jobs[len(jobs) - extra:]
                if not jobs:
                    del self._successors[(queue, key)]
                self._unsure = True

    @property
    def unsure(self) -> bool:
        """Reservations are held for this worker that it does not follow (dropped,
        or possibly committed by a write that failed): :meth:`give_back` them."""
        return self._unsure

    async def give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Give back every reservation of this worker but those it follows: on its
        own, or inside an outcome write (:meth:`take_in`; if that write fails,
        :meth:`settle` marks them to give back again)."""
        keep = [job.id for jobs in self._successors.values() for job in jobs]
        await conn.execute(queries.get("give_back_reserved"), {
            "worker_id": self._settings.worker_id,
            "keep": keep + [job.id for job in self._carried.values()]})
        self._unsure = False
