"""Worker leases: the heartbeat row of each worker in ``akadze.workers``.

A worker renews its row every third of its lease. Any worker presumes a worker
whose heartbeat is older than its lease dead and rescues its running jobs
(:mod:`akadze.maintenance`). A worker that cannot renew its own lease for a whole
lease stops claiming and gives its jobs back (self-fencing, in the worker), and
``run_count`` fencing discards anything it would still try to finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from . import backoff, outcomes, queries
from .database import describe
from .errors import WorkerError
from .migrate import latest_version
from .resilience import Trouble

if TYPE_CHECKING:
    from .execution import _Run

logger = logging.getLogger("akadze.worker")


async def heartbeat(
    conn: psycopg.AsyncConnection[Any],
    *,
    worker_id: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    lease: float,
    now: datetime | None = None,
) -> bool:
    """Register or renew the lease of ``worker_id``; True when its row had to be
    created (first heartbeat, or the worker had been presumed dead)."""
    cur = await conn.execute(
        queries.get("worker_heartbeat"),
        {"id": worker_id, "host": host, "pid": pid, "queues": list(queues), "lease": lease,
         "now": now},
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def unregister(conn: psycopg.AsyncConnection[Any], worker_id: str) -> None:
    await conn.execute(queries.get("worker_unregister"), {"id": worker_id})


async def cancel_requested(conn: psycopg.AsyncConnection[Any], worker_id: str) -> list[int]:
    """Ids of this worker's running jobs whose cancellation was requested."""
    cur = await conn.execute(queries.get("worker_cancel_requested"), {"worker_id": worker_id})
    return [int(str(row[0])) for row in await cur.fetchall()]


class LeaseKeeping:
    """The worker's lease: heartbeat loop, self-fencing (mixed into Worker)."""

    worker_id: str
    queues: list[str]
    lease: float
    _url: str
    _registered: asyncio.Event
    _heartbeat_tried: asyncio.Event
    _fence_timer: asyncio.TimerHandle | None
    _fenced: bool
    _trouble: Trouble
    _random: random.Random
    _running: dict[int, _Run]

    if TYPE_CHECKING:  # provided by Worker

        def sql_now(self) -> datetime | None: ...

        def async_connection(
            self,
        ) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

        def _wake_all(self) -> None: ...

        def _abandon(self, run: _Run, finish: outcomes.Finish, reason: str) -> None: ...

    # -- heartbeat and self-fencing -------------------------------------------------------

    async def _register(self, *, first: bool) -> None:
        async with self.async_connection() as conn:
            if first:
                await self._check_schema(conn)
            inserted = await heartbeat(
                conn, worker_id=self.worker_id, host=socket.gethostname(), pid=os.getpid(),
                queues=self.queues, lease=self.lease, now=self.sql_now(),
            )
        if inserted and self._registered.is_set():
            logger.warning(
                "worker %s: its lease had expired and it was presumed dead; registered again "
                "(jobs rescued meanwhile will not be finished by it)", self.worker_id)
        self._registered.set()

    async def _check_schema(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            cur = await conn.execute("SELECT max(version) FROM akadze.migrations")
            row = await cur.fetchone()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            raise WorkerError(
                f"the database {describe(self._url)} has no akadze schema: run `akadze migrate`"
            ) from None
        version = int(str(row[0])) if row and row[0] is not None else 0
        if version < latest_version():
            raise WorkerError(
                f"the database schema is at version {version} and this worker needs "
                f"{latest_version()}: run `akadze migrate`"
            )

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.lease / 3
        first = True
        while True:
            sent = loop.time()
            try:
                async with asyncio.timeout(max(interval, 0.05)):
                    await self._register(first=first)
            except WorkerError:
                raise
            except Exception as exc:
                delay = min(interval, backoff.reconnect_delay(
                    self._trouble.failures("heartbeat") + 1, self._random.random()))
                self._trouble.failed("heartbeat", exc, delay)
                self._heartbeat_tried.set()
                await asyncio.sleep(delay)
                continue
            first = False
            self._heartbeat_tried.set()
            self._trouble.recovered("heartbeat")
            self._renewed(sent)
            await asyncio.sleep(interval)

    def _renewed(self, sent: float) -> None:
        """A heartbeat sent at loop time ``sent`` succeeded: the lease holds until
        ``sent + lease`` at the earliest, as other workers see it."""
        loop = asyncio.get_running_loop()
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        self._fence_timer = loop.call_at(sent + self.lease, self._self_fence)
        if self._fenced:
            self._fenced = False
            logger.warning("worker %s: lease renewed; claiming again", self.worker_id)
            self._wake_all()

    def _self_fence(self) -> None:
        """The lease ran out without a renewal: others may rescue this worker's jobs now.
        Stop claiming and give every running job back; their results are dropped."""
        if self._fenced:
            return
        self._fenced = True
        logger.error(
            "worker %s: could not renew its lease for %g s; stopped claiming and giving "
            "back %d running job%s", self.worker_id, self.lease, len(self._running),
            "" if len(self._running) == 1 else "s", extra={"worker_id": self.worker_id},
        )
        for run in list(self._running.values()):
            self._abandon(run, outcomes.given_back(run.job), "give_back")

