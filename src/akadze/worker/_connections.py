"""The worker's database connections, owned in one place, within one budget.

A worker process opens at most ``Settings.connections`` server connections (default
3, plus 1 per 10 slots over all its queues), split by :func:`split_budget`:

- the LISTEN connection of the listener (when listening), dedicated, opened by it
  through :meth:`Connections.listen_connection`, on ``listen_url`` when one is given;
  the lease keeper's heartbeats borrow it between notifications;
- the claim pool: claims only (one claim at a time per connection; a queue's claims
  take turns on the server anyway), at most one per queue;
- the sync pool, opened on first use, only for a worker with plain (thread) tasks:
  ``complete_tx`` in those tasks;
- the general pool, the rest: outcome writes, maintenance, cancellation polls,
  reconciling a lost claim reply, ``complete_tx`` in async tasks, and heartbeats
  when not listening (or while the LISTEN connection is lost).

Pools keep one connection open when idle and grow to their share on demand. No
connection is held while a task runs. Nothing here relies on the session outliving a
transaction, so any pool may go through a pooler in transaction mode: no startup
options (a claim sets ``synchronous_commit`` for its own transaction), and with
``transaction_pooling`` no server-side prepared statements (``prepare_threshold=None``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool

from ..errors import WorkerError
from ._settings import Settings

APPLICATION_NAME = "akadze-worker"
LISTEN_APPLICATION_NAME = "akadze-worker-listen"
#: Seconds a connection may rest in the general pool and still be lent unchecked.
CHECK_AFTER_IDLE = 1.0


@dataclass(frozen=True, slots=True)
class Budget:
    """How a worker's connections are shared out; ``total`` is the sum."""

    listen: int
    claims: int
    general: int
    sync: int

    @property
    def total(self) -> int:
        return self.listen + self.claims + self.general + self.sync


def split_budget(connections: int, queues: int, listen: bool, plain: bool) -> Budget:
    """Share ``connections`` out: LISTEN 1 (when listening); claims a third of the
    rest, at least 1 and at most one per queue; the sync pool (plain tasks only) a
    third of what is left, at least 1; the general pool the remainder, at least 1
    when listening (heartbeats run on the LISTEN connection, see
    :meth:`~._listener.Listener.lent`), else at least 2 (so that a heartbeat never
    waits behind the other uses). ``connections`` is at least the minimum (settings
    checked it)."""
    rest = connections - int(listen)
    claims = max(1, min(queues, rest // 3))
    sync = max(1, (rest - claims) // 3) if plain else 0
    general = rest - claims - sync
    if general < (1 if listen else 2):
        raise WorkerError(f"{connections} connections are too few for this worker")
    return Budget(int(listen), claims, general, sync)


class IdleCheck:
    """The general pool's check on lending: a connection back in the pool for less
    than ``CHECK_AFTER_IDLE`` seconds is lent as it is (the use that just ended
    proved it); an older one is checked with an empty query, as the server (a
    restart, a pooler's idle timeout) may have closed it meanwhile. On a busy
    worker the outcome writes follow each other closely, and checking each
    connection cost a round trip per write (6 % of a worker's samples in a
    profile of the many-keys limits run) and, through a network, its latency on
    the path of each slot a write frees. Real time
    (``monotonic``), not the worker's clock: this is about sockets, not jobs."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._returned: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary())

    async def returned(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The pool's ``reset``: ``conn`` is back, idle and open."""
        self._returned[conn] = self._monotonic()

    async def check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The pool's ``check``: raise if ``conn`` may not be used."""
        returned = self._returned.pop(conn, None)
        if (returned is None or conn.broken
                or self._monotonic() - returned >= CHECK_AFTER_IDLE):
            await psycopg_pool.AsyncConnectionPool.check_connection(conn)


class Connections:
    """Opens, lends and closes the connections of one worker."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.budget = split_budget(settings.connections, len(settings.queues),
                                   settings.listen, settings.any_plain_task)
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._claim_pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._sync_pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._sync_pool_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._settings.url

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": APPLICATION_NAME}
        if self._settings.transaction_pooling:
            # Each statement may land on another server connection: a statement
            # prepared on one is unknown on the next (PgBouncer < 1.21).
            kwargs["prepare_threshold"] = None
        return kwargs

    async def open(self) -> None:
        """Create the pools; their connections are made in the background (a
        database that is not there yet shows up as failing borrowers, not here)."""
        settings, budget = self._settings, self.budget
        timeout = max(0.2, min(5.0, settings.lease / 3))
        idle = IdleCheck()
        self._pool = psycopg_pool.AsyncConnectionPool(
            settings.url, min_size=1, max_size=budget.general, open=False,
            timeout=timeout, check=idle.check, reset=idle.returned,
            kwargs=self._kwargs(), name="akadze-worker",
        )
        await self._pool.open(wait=False)
        self._claim_pool = psycopg_pool.AsyncConnectionPool(
            settings.url, min_size=1, max_size=budget.claims, open=False,
            timeout=timeout,
            # No check on checkout (a round trip per claim): a broken connection fails
            # one claim, which is retried at once and then reconciled.
            kwargs=self._kwargs(), name="akadze-worker-claims",
        )
        await self._claim_pool.open(wait=False)

    async def close(self) -> None:
        for pool in (self._claim_pool, self._pool):
            if pool is not None:
                await pool.close(timeout=1.0)
        if self._sync_pool is not None:
            await asyncio.to_thread(self._sync_pool.close)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the general pool (autocommit)."""
        if self._pool is None:
            raise WorkerError("the worker is not running")
        async with self._pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def claim_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for one claim (autocommit; the claim runs its own transaction)."""
        if self._claim_pool is None:
            raise WorkerError("the worker is not running")
        async with self._claim_pool.connection() as conn:
            yield conn

    @property
    def durable_claims(self) -> bool | None:
        """What the claim loops pass to ``claim(durable=...)``: by default a claim's
        commit does not wait for the WAL flush (``False``); with ``durable_claims``
        the session's setting stands (``None``)."""
        return None if self._settings.durable_claims else False

    @contextmanager
    def sync_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for a plain task's thread (the sync pool, opened on first use)."""
        with self._sync_pool_lock:
            if self._sync_pool is None:
                self._sync_pool = psycopg_pool.ConnectionPool(
                    self._settings.url, min_size=0, max_size=max(1, self.budget.sync),
                    open=True, timeout=30, kwargs=self._kwargs(), name="akadze-worker-sync",
                )
            pool = self._sync_pool
        with pool.connection() as conn:
            yield conn

    async def listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A new connection of its own for LISTEN (the caller closes it): on
        ``listen_url`` when given (LISTEN needs a session, which a pooler in
        transaction mode does not keep), else on the worker's URL."""
        settings = self._settings
        return await psycopg.AsyncConnection.connect(
            settings.listen_url or settings.url, autocommit=True,
            application_name=LISTEN_APPLICATION_NAME)
