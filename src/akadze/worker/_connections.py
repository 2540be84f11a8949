"""The worker's database connections, owned in one place.

- the general pool: outcome writes, heartbeats, maintenance, cancellation polls,
  reconciling a lost claim reply, ``complete_tx`` in async tasks;
- the claim pool: one connection per queue (plus one), whose commits do not wait
  for the WAL flush unless ``durable_claims`` is set;
- the sync pool, opened on first use: ``complete_tx`` in plain (thread) tasks;
- the LISTEN connection of the listener, dedicated and opened by it through
  :meth:`Connections.listen_connection`.

No connection is held while a task runs. How many connections a worker may use,
and how they are shared, is decided here and nowhere else.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import psycopg_pool

from ..errors import WorkerError
from ._settings import Settings

APPLICATION_NAME = "akadze-worker"
LISTEN_APPLICATION_NAME = "akadze-worker-listen"


class Connections:
    """Opens, lends and closes the connections of one worker."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._claim_pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._sync_pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._sync_pool_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._settings.url

    async def open(self) -> None:
        """Create the pools; their connections are made in the background (a
        database that is not there yet shows up as failing borrowers, not here)."""
        settings = self._settings
        timeout = max(0.2, min(5.0, settings.lease / 3))
        self._pool = psycopg_pool.AsyncConnectionPool(
            settings.url, min_size=1, max_size=settings.pool_size, open=False,
            timeout=timeout, check=psycopg_pool.AsyncConnectionPool.check_connection,
            kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
            name="akadze-worker",
        )
        await self._pool.open(wait=False)
        # Unless durable_claims is set, claim commits do not wait for the WAL flush
        # (synchronous_commit off, these connections only): a claim is on disk with
        # the next durable commit (the job's outcome, at the latest), and a server
        # crash can only undo a claim whose outcome was not durable yet, so the job
        # runs again, as after any crash during a run. Delivery stays at least once;
        # pick-up does not wait for fsync.
        # A claim's transaction holds the rows of the keys it claims (FOR NO KEY UPDATE)
        # between its round trips: a claim connection that stops answering mid-claim
        # (a partitioned network that closes nothing) would block every other worker's
        # claims of those keys for as long as it lasts. The server ends such a session
        # once it was idle in a transaction for half a lease (1 s at least), which is
        # never the case of a claim in progress (its statements go back to back); the
        # claim rolls back, and the worker's next claim reconciles.
        idle_ms = int(max(1.0, settings.lease / 2) * 1000)
        options = f"-c idle_in_transaction_session_timeout={idle_ms}"
        if not settings.durable_claims:
            options += " -c synchronous_commit=off"
        claim_kwargs: dict[str, Any] = {"autocommit": True,
                                        "application_name": APPLICATION_NAME,
                                        "options": options}
        self._claim_pool = psycopg_pool.AsyncConnectionPool(
            settings.url, min_size=1, max_size=len(settings.queues) + 1, open=False,
            timeout=timeout,
            # No check on checkout (a round trip per claim): a broken connection fails
            # one claim, which is retried at once and then reconciled.
            kwargs=claim_kwargs, name="akadze-worker-claims",
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

    @contextmanager
    def sync_connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for a plain task's thread (the sync pool, opened on first use)."""
        with self._sync_pool_lock:
            if self._sync_pool is None:
                self._sync_pool = psycopg_pool.ConnectionPool(
                    self._settings.url, min_size=0, max_size=4, open=True, timeout=30,
                    kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
                    name="akadze-worker-sync",
                )
            pool = self._sync_pool
        with pool.connection() as conn:
            yield conn

    async def listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A new connection of its own for LISTEN (the caller closes it)."""
        return await psycopg.AsyncConnection.connect(
            self._settings.url, autocommit=True, application_name=LISTEN_APPLICATION_NAME)
