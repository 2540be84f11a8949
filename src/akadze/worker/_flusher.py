"""The outcome flusher: finishes are collected and written in batches.

The runner hands each decided finish to :meth:`OutcomeFlusher.submit`; the flush
loop writes what is pending, many finishes per statement (``_finishes.write``),
each row fenced by its claim token, and reports what the fence refused (those runs'
outcomes are lost: the job is no longer theirs). After a retry or a snooze is
written, ``on_due`` learns when the job will be ready again. A row whose data the
database refuses fails alone (``_refusals``): the rest of its batch is written.

A write is three steps, kept apart so that a later writer (one that shares a
round trip with the next claim) can take the same batch: :meth:`take` the batch,
write it, then :meth:`written` (or keep it pending after a failure). In the
transaction that writes a batch, the hand-offs (:mod:`._handoffs`) start the next
jobs of the limited keys whose runs it ended; the slots those runs left stay
reserved until the write is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from .. import backoff, outcomes
from ._connections import Connections
from ._finishes import Reader, write
from ._handoffs import HandOffs, Took
from ._refusals import write_splitting
from ._state import WorkerState

logger = logging.getLogger("akadze.worker")

#: Most finishes written by one statement.
MAX_BATCH = 5_000

OnDue = Callable[[str, float], None]
#: Told the queues of written outcomes of jobs with a limit key: their keys have room.
OnRoom = Callable[[str], None]


class OutcomeFlusher:
    """Pending finishes and their writing."""

    def __init__(self, state: WorkerState, connections: Connections, *, on_due: OnDue,
                 on_room: OnRoom | None = None, hand_offs: HandOffs | None = None) -> None:
        self._state = state
        self._connections = connections
        self._hand_offs = hand_offs
        self._write_lock = asyncio.Lock()
        self._on_due = on_due
        self._on_room = on_room
        self._pending: list[outcomes.Finish] = []
        self._wanted = asyncio.Event()
        #: Jobs of the batch being written that failed instead of their outcome.
        self._failed_instead: set[int] = set()

    # -- what the others see ------------------------------------------------------------

    def submit(self, finish: outcomes.Finish) -> None:
        """Write ``finish`` with the next batch."""
        if self._hand_offs is not None:
            self._hand_offs.reserve(finish)
        self._pending.append(finish)
        self._wanted.set()

    def wake(self) -> None:
        """Look again: reservations may wait to be given back."""
        self._wanted.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def pending_ids(self) -> set[int]:
        return {finish.job.id for finish in self._pending}

    def backlogged(self) -> bool:
        """Too many outcomes wait to be written: claiming pauses."""
        return len(self._pending) >= self._state.settings.max_pending

    # -- the steps of a write -----------------------------------------------------------

    def take(self) -> list[outcomes.Finish]:
        """The next batch to write (still pending until :meth:`written`)."""
        return self._pending[:MAX_BATCH]

    def written(self, batch: list[outcomes.Finish], accepted: set[int], *,
                retried: bool) -> None:
        """``batch`` (from :meth:`take`) is committed; ``accepted``: the ids whose fence
        held. ``retried``: an earlier attempt at writing it failed (and may have
        committed unseen: a refusal then is that commit, not a lost run)."""
        del self._pending[: len(batch)]
        now = asyncio.get_running_loop().time()
        discarded: list[int] = []
        failed_instead, self._failed_instead = self._failed_instead, set()
        roomy: set[str] = set()
        for finish in batch:
            job = finish.job
            if job.id in accepted:
                if job.limit_key is not None:
                    roomy.add(job.queue)
                if (finish.delay is not None and finish.state.value == "queued"
                        and job.id not in failed_instead):
                    self._on_due(job.queue, now + finish.delay)
                continue
            if retried:
                logger.debug("job %d: outcome already written or no longer ours", job.id)
                continue
            discarded.append(job.id)
            self._state.counts["lost"] += 1
            logger.warning(
                "job %d (%s): outcome %s discarded: the job is no longer this run's "
                "(rescued, cancelled or timed out meanwhile)", job.id, job.task,
                finish.kind, extra={"job_id": job.id, "task": job.task})
        if self._on_room is not None:
            for queue in roomy:  # a slot of a key may have freed: claim again now
                self._on_room(queue)
        events = self._state.events
        if events.wanted:
            events.emit("outcomes_written", job_ids=sorted(accepted), discarded=discarded)

    async def _write(self, batch: list[outcomes.Finish]) -> set[int]:
        if not batch:
            return set()
        settings = self._state.settings
        hooks = settings.app.on_transition_hooks
        hand_offs = self._hand_offs
        started: list[Took] = []
        failed = True
        try:
            async with self._connections.connection() as conn:
                async def write_part(part: Sequence[outcomes.Finish]) -> set[int]:
                    if hand_offs is None or not hand_offs.wanted(part):
                        return await write(conn, part, hooks=hooks, now=settings.sql_now())
                    taken: list[Took] = []
                    took = Took()
                    before_keys = hand_offs.carried_keys(part)

                    async def before(conn: psycopg.AsyncConnection[Any]) -> None:
                        await hand_offs.start_in(conn, part, took)

                    async def then(conn: psycopg.AsyncConnection[Any]) -> Reader:
                        read = await hand_offs.take_in(conn, part, took)

                        async def reader() -> None:
                            taken.append(await read())

                        return reader

                    async with hand_offs.quiet:
                        accepted = await write(
                            conn, part, hooks=hooks, now=settings.sql_now(), then=then,
                            before=before if before_keys else None,
                            before_keys=before_keys)
                    started.extend(taken)  # committed: the write returned
                    return accepted

                accepted, replaced = await write_splitting(write_part, batch,
                                                           settings.wall_now())
            failed = False
        finally:
            if hand_offs is not None:
                hand_offs.settle(batch, started, failed=failed)
        for refused, instead in replaced:
            self._replaced(refused, instead, accepted)
        return accepted

    def _replaced(self, refused: outcomes.Finish, instead: outcomes.Finish,
                  accepted: set[int]) -> None:
        """The database refused ``refused``; ``instead`` (the job failed) was written."""
        job = refused.job
        if job.id not in accepted:
            return  # the fence refused the failure too: the job is no longer this run's
        counts = self._state.counts
        counts[refused.kind] -= 1
        counts[instead.kind] += 1
        self._failed_instead.add(job.id)
        logger.error(
            "job %d (%s): the database refused its outcome (%s); the job is failed "
            "instead: %s", job.id, job.task, refused.kind, _message(instead),
            extra={"job_id": job.id, "task": job.task})

    # -- writing ------------------------------------------------------------------------

    async def run(self) -> None:
        """The flush loop: write whatever is pending, retrying after failures."""
        state = self._state
        where = "writing outcomes"
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            expiry = None if self._hand_offs is None else self._hand_offs.next_expiry()
            if expiry is None:
                await self._wanted.wait()
            else:  # or until the oldest reservation is to go back
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), max(0.0, expiry - loop.time()))
            self._wanted.clear()
            if self._hand_offs is not None:
                self._hand_offs.expire(loop.time())
            while self._pending:
                delay = 0.0
                async with self._write_lock:
                    batch = self.take()
                    try:
                        accepted = await self._write(batch)
                    except Exception as exc:
                        failures += 1
                        delay = backoff.reconnect_delay(failures, state.random.random())
                        state.trouble.failed(where, exc, delay)
                    else:
                        self.written(batch, accepted, retried=failures > 0)
                        failures = 0
                        state.trouble.recovered(where)
                if delay:
                    await asyncio.sleep(delay)
            if (not self._pending and self._hand_offs is not None
                    and self._hand_offs.unsure and not (state.stopping or state.fenced)):
                async with self._write_lock:
                    try:
                        async with self._connections.connection() as conn:
                            await self._hand_offs.give_back(conn)
                    except Exception as exc:  # the next write gives them back
                        logger.debug("giving back reservations failed: %s", exc)
            state.unblock()
            state.settled.set()

    async def flush_all(self, *, raise_errors: bool) -> None:
        """Write every pending outcome now (drain and shutdown); on a failure, raise
        or return with the rest still pending."""
        while self._pending:
            async with self._write_lock:
                batch = self.take()
                try:
                    accepted = await self._write(batch)
                except Exception:
                    if raise_errors:
                        raise
                    return
                self.written(batch, accepted, retried=False)


def _message(finish: outcomes.Finish) -> str:
    entry = json.loads(finish.error or "{}")
    return str(entry.get("message", ""))
