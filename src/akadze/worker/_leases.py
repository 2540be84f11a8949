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
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from .. import backoff, queries
from ..database import describe
from ..errors import WorkerError
from ..migrate import available
from ._connections import Connections
from ._state import WorkerState

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
) -> bool:
    """Register or renew the lease of ``worker_id`` (with the names of the ``tasks`` it
    runs); True when its row had to be created (first heartbeat, or the worker had been
    presumed dead)."""
    cur = await conn.execute(
        queries.get("worker_heartbeat"),
        {"id": worker_id, "host": host, "pid": pid, "queues": list(queues),
         "tasks": list(tasks), "lease": lease, "now": now},
    )
    row = await cur.fetchone()
    return bool(row and row[0])


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


class LeaseKeeper:
    """Keeps the worker's lease, and fences the worker when it cannot."""

    def __init__(self, state: WorkerState, connections: Connections, *,
                 on_fence: Callable[[], list[int]], on_unfence: Callable[[], None]) -> None:
        self._state = state
        self._settings = state.settings
        self._connections = connections
        self._on_fence = on_fence
        self._on_unfence = on_unfence
        self._fence_timer: asyncio.TimerHandle | None = None
        self._warned: set[tuple[str, str]] = set()
        #: Set after the first heartbeat attempt, whether it worked or not.
        self.tried = asyncio.Event()

    async def register(self, *, first: bool) -> None:
        """Renew the lease (``first``: check the schema, then create the row)."""
        settings = self._settings
        async with self._connections.connection() as conn:
            if first:
                await check_schema(conn, settings.url)
            inserted = await heartbeat(
                conn, worker_id=settings.worker_id, host=socket.gethostname(),
                pid=os.getpid(), queues=settings.queues, lease=settings.lease,
                tasks=settings.task_names, now=settings.sql_now(),
            )
            await self._warn_unserved(conn)
        if inserted and self._state.registered.is_set():
            logger.warning(
                "worker %s: its lease had expired and it was presumed dead; registered again "
                "(jobs rescued meanwhile will not be finished by it)", settings.worker_id)
        self._state.registered.set()

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
            state.trouble.recovered("heartbeat")
            self._renewed(sent)
            await asyncio.sleep(interval)

    def close(self) -> None:
        if self._fence_timer is not None:
            self._fence_timer.cancel()

    def _renewed(self, sent: float) -> None:
        """A heartbeat sent at loop time ``sent`` succeeded: the lease holds until
        ``sent + lease`` at the earliest, as other workers see it."""
        state = self._state
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        self._fence_timer = asyncio.get_running_loop().call_at(
            sent + self._settings.lease, self._self_fence)
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
