"""The lease keeper: the worker's heartbeat row in ``akadze.workers``, and self-fencing.

A worker renews its row every third of its lease. Any worker presumes a worker
whose heartbeat is older than its lease dead and rescues its running jobs
(:mod:`._maintenance`). A worker that cannot renew its own lease for a whole
lease stops claiming and gives its jobs back (self-fencing: ``on_fence``; once a
heartbeat works again, ``on_unfence``), and claim-token fencing discards
anything it would still try to finish.

It changes ``state.registered`` and ``state.fenced``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg

from .. import backoff, queries
from ..database import describe
from ..errors import WorkerError
from ..migrate import available
from ._connections import Connections
from ._ownership import OwnershipCheck
from ._state import WorkerState, wait_for

logger = logging.getLogger("akadze.worker")


async def heartbeat(
    conn: psycopg.AsyncConnection[Any],
    *,
    worker_id: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    lease: float,
    tasks: Sequence[str] = (),
    now: datetime | None = None,
) -> tuple[bool, datetime | None]:
    """Register or renew the lease of ``worker_id`` (with the names of the ``tasks`` it
    runs). Returns whether its row had to be created (first heartbeat, or the worker had
    been presumed dead), and when the server started."""
    cur = await conn.execute(
        queries.get("worker_heartbeat"),
        {"id": worker_id, "host": host, "pid": pid, "queues": list(queues),
         "tasks": list(tasks), "lease": lease, "now": now},
    )
    row = await cur.fetchone()
    if row is None:
        return False, None
    return bool(row[0]), row[1]


#: How a failing check of the running jobs (:mod:`._ownership`) is reported.
CHECK_RUNS = "checking running jobs"

#: A heartbeat is sent between (1 - HEARTBEAT_SPREAD) and 1 times a third of the
#: lease after the last one: workers started together (a deploy) drift apart instead
#: of renewing in one burst every third of a lease. Never later: the lease only
#: gains from an early renewal.
HEARTBEAT_SPREAD = 0.2


def renew_in(interval: float, draw: float) -> float:
    """Seconds until the next heartbeat, for a ``draw`` in [0, 1): within
    [(1 - HEARTBEAT_SPREAD) x ``interval``, ``interval``]."""
    return interval * (1.0 - HEARTBEAT_SPREAD * max(0.0, min(draw, 1.0)))


#: Ready jobs read per ready index and queue by :func:`unserved_tasks`.
UNSERVED_SAMPLE = 200


async def unserved_tasks(
    conn: psycopg.AsyncConnection[Any], *, queues: Sequence[str], tasks: Sequence[str],
    now: datetime | None = None,
) -> list[tuple[str, str, int]]:
    """``(queue, task, ready jobs seen)`` for the tasks of ready jobs at the head of
    ``queues`` that no live worker of the queue runs (this one runs ``tasks``)."""
    cur = await conn.execute(
        queries.get("worker_unserved_tasks"),
        {"queues": list(queues), "tasks": list(tasks), "sample": UNSERVED_SAMPLE, "now": now},
    )
    return [(str(q), str(t), int(n)) for q, t, n in await cur.fetchall()]


async def check_schema(conn: psycopg.AsyncConnection[Any], url: str) -> None:
    """WorkerError unless the database has every migration of this akadze (a number
    can land after higher ones: 0007 came after 0009, so the highest is not enough)."""
    try:
        cur = await conn.execute("SELECT version FROM akadze.migrations")
        applied = {int(str(row[0])) for row in await cur.fetchall()}
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        raise WorkerError(
            f"the database {describe(url)} has no akadze schema: run `akadze migrate`"
        ) from None
    missing = [m.version for m in available() if m.version not in applied]
    if missing:
        raise WorkerError(
            f"the database schema is at version {max(applied, default=0)} and lacks "
            f"migration{'s' if len(missing) > 1 else ''} "
            f"{', '.join(f'{v:04d}' for v in missing)} that this worker needs: "
            "run `akadze migrate`"
        )


#: Lends a dedicated connection (the listener's), or yields None when it has none.
Lender = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any] | None]]


class LeaseKeeper:
    """Keeps the worker's lease, and fences the worker when it cannot.

    Heartbeats run on the connection ``lend`` lends when it has one (a listening
    worker's LISTEN connection, idle between notifications), so they never wait
    behind the general pool's other uses; else on the general pool."""

    def __init__(self, state: WorkerState, connections: Connections, *,
                 on_fence: Callable[[], list[int]], on_unfence: Callable[[], None],
                 ownership: OwnershipCheck | None = None,
                 lend: Lender | None = None) -> None:
        self._state = state
        self._settings = state.settings
        self._connections = connections
        self._lend = lend
        self._on_fence = on_fence
        self._on_unfence = on_unfence
        self._ownership = ownership
        self._fence_timer: asyncio.TimerHandle | None = None
        self._warned: set[tuple[str, str]] = set()
        self._server_started: datetime | None = None
        #: Set to renew at once (a check of the runs is due).
        self._renew_now = asyncio.Event()
        if ownership is not None:
            ownership.on_wanted = self._renew_now.set
        #: Set after the first heartbeat attempt, whether it worked or not.
        self.tried = asyncio.Event()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._lend is not None:
            async with self._lend() as lent:
                if lent is not None:
                    yield lent
                    return
        async with self._connections.connection() as conn:
            yield conn

    async def register(self, *, first: bool) -> None:
        """Renew the lease (``first``: check the schema, then create the row)."""
        settings = self._settings
        async with self._connection() as conn:
            if first:
                await check_schema(conn, settings.url)
            inserted, server_started = await heartbeat(
                conn, worker_id=settings.worker_id, host=socket.gethostname(),
                pid=os.getpid(), queues=settings.queues, lease=settings.lease,
                tasks=settings.task_names, now=settings.sql_now(),
            )
            self._noticed(inserted, server_started)
            if self._ownership is not None:
                await self._check_runs(conn, self._ownership)
            # The row exists and the lease holds: claims may begin (the look for
            # jobs nobody runs below is only a warning, and need not delay them).
            self._state.registered.set()
            await self._warn_unserved(conn)

    def _noticed(self, inserted: bool, server_started: datetime | None) -> None:
        """What a heartbeat shows about the time since the last one."""
        settings, ownership = self._settings, self._ownership
        again = self._state.registered.is_set()
        if inserted and again:
            logger.warning(
                "worker %s: its lease had expired and it was presumed dead; registered again "
                "(jobs rescued meanwhile will not be finished by it)", settings.worker_id)
            if ownership is not None:
                ownership.want("its lease had expired")
        known, self._server_started = self._server_started, server_started
        if known is not None and server_started != known and ownership is not None:
            ownership.want("a restart of the server (or a failover)")

    async def _check_runs(self, conn: psycopg.AsyncConnection[Any],
                          ownership: OwnershipCheck) -> None:
        """The check of the runs, right after the lease was renewed: its failure is not
        the heartbeat's (the check stays due and runs after the next renewal)."""
        where = CHECK_RUNS
        try:
            await ownership.run(conn)
        except psycopg.Error as exc:
            self._state.trouble.failed(where, exc, self._settings.lease / 3)
        else:
            self._state.trouble.recovered(where)

    async def _warn_unserved(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Warn, once per queue and task, about ready jobs that no live worker runs."""
        settings = self._settings
        try:
            found = await unserved_tasks(conn, queues=settings.queues,
                                         tasks=settings.task_names, now=settings.sql_now())
        except psycopg.Error as exc:  # only a warning is lost; the lease was renewed
            logger.debug("could not look for jobs of tasks nobody runs: %s", exc)
            return
        for queue, task, count in found:
            if (queue, task) in self._warned:
                continue
            self._warned.add((queue, task))
            logger.warning(
                "queue %r has ready jobs of task %r (%d%s at the head of the queue) that no "
                "live worker of the queue runs: they wait until a worker whose app registers "
                "that task serves the queue (this worker runs %s)", queue, task, count,
                "+" if count >= UNSERVED_SAMPLE else "", ", ".join(settings.task_names),
                extra={"queue": queue, "task": task, "worker_id": settings.worker_id},
            )

    async def unregister(self) -> None:
        async with self._connections.connection() as conn:
            await conn.execute(queries.get("worker_unregister"), {"id": self._settings.worker_id})

    async def run(self) -> None:
        """The heartbeat loop; raises WorkerError when the worker cannot run at all."""
        state = self._state
        loop = asyncio.get_running_loop()
        interval = self._settings.lease / 3
        first = True
        while True:
            sent = loop.time()
            self._renew_now.clear()
            if state.trouble.failures("heartbeat") and self._ownership is not None:
                self._ownership.want("the database could not be reached")
            try:
                async with asyncio.timeout(max(interval, 0.05)):
                    await self.register(first=first)
            except WorkerError:
                raise
            except Exception as exc:
                delay = min(interval, backoff.reconnect_delay(
                    state.trouble.failures("heartbeat") + 1, state.random.random()))
                state.trouble.failed("heartbeat", exc, delay)
                self.tried.set()
                await asyncio.sleep(delay)
                continue
            first = False
            self.tried.set()
            self._renewed(sent)
            state.trouble.recovered("heartbeat")
            await wait_for(self._renew_now, renew_in(interval, state.random.random()))

    def close(self) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()

    def _renewed(self, sent: float) -> None:
        """A heartbeat sent at loop time ``sent`` succeeded: the lease holds until
        ``sent + lease`` at the earliest, as other workers see it."""
        state = self._state
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        state.lease_until = sent + self._settings.lease
        self._fence_timer = asyncio.get_running_loop().call_at(
            state.lease_until, self._self_fence)
        state.events.emit("lease_renewed")
        if state.fenced:
            state.fenced = False
            logger.warning("worker %s: lease renewed; claiming again", self._settings.worker_id)
            self._on_unfence()

    def _self_fence(self) -> None:
        """The lease ran out without a renewal: others may rescue this worker's jobs now.
        Stop claiming and give every running job back; their results are dropped."""
        state = self._state
        if state.fenced:
            return
        state.fenced = True
        logger.error(
            "worker %s: could not renew its lease for %g s; stopped claiming and giving "
            "back %d running job%s", self._settings.worker_id, self._settings.lease,
            len(state.running), "" if len(state.running) == 1 else "s",
            extra={"worker_id": self._settings.worker_id},
        )
        given_back = self._on_fence()
        state.events.emit("fenced", job_ids=given_back)
