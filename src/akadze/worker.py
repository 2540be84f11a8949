"""The worker: one asyncio process that claims jobs and runs them.

Per queue, a claim loop fills the queue's free slots with one claim call; each
claimed job runs as an asyncio task (a plain function runs in a bounded thread
pool, one thread per slot). Outcomes are collected and written in batches, many
finished jobs per statement, each row fenced by ``run_count``. No connection is
held while a task runs: claims, outcome writes, heartbeats and maintenance borrow
connections from a pool; LISTEN has a connection of its own.

Alongside: the lease heartbeat and self-fencing (:mod:`akadze.leases`), the
cluster maintenance round (:mod:`akadze.maintenance`), wake-up by notification
or polling (:mod:`akadze.wakeup`), cancellation of running jobs, graceful and
forced shutdown, and reconnecting after database trouble (:mod:`akadze.resilience`).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import random
import signal
import socket
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from . import backoff, leases, outcomes, queries
from .claim import claim
from .clock import SystemClock
from .database import describe
from .errors import ConfigurationError, WorkerError
from .execution import Execution, _Run
from .jobs import ClaimedJob, job_rows
from .leases import LeaseKeeping
from .maintenance import MaintenanceLoop
from .resilience import Trouble, is_transient
from .wakeup import Listener

if TYPE_CHECKING:
    from .app import Akadze
    from .clock import Clock

logger = logging.getLogger("akadze.worker")

#: Cap on a claim-loop's wait after a notification, to batch a burst of enqueues.
DEBOUNCE = 0.002


@dataclass
class _Queue:
    name: str
    busy: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    due: list[float] = field(default_factory=list)  # loop times of known future run_at
    last_claim: float = 0.0
    retimer: asyncio.Event = field(default_factory=asyncio.Event)
    suspect: bool = False  # a claim failed: its commit may have gone through unseen


def _seconds(value: timedelta | float, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ConfigurationError(f"{name} must be a non-negative number of seconds or timedelta")
    return float(seconds)


class Worker(Execution, LeaseKeeping, MaintenanceLoop):
    """Claims and runs the jobs of ``queues``.

    ``slots``: jobs run at once per queue. ``fair``: fair claim order across
    ``limit_key`` groups. ``lease``: how long the worker's heartbeat stays valid.
    ``shutdown_timeout``: how long a graceful stop waits for running jobs before
    giving them back. ``poll_interval``: the polling period (jittered) that backs
    up notifications. ``listen=False`` turns LISTEN/NOTIFY off (PgBouncer in
    transaction pooling mode). ``clock``: inject database time (tests).
    ``durable_claims=True`` makes each claim wait for its WAL flush (by default claims
    commit asynchronously, outcomes durably; see docs/explanation/job-states.md).

    ``await worker.run()`` runs until :meth:`stop`; ``async with Worker(...)``
    runs it in the background and stops it cleanly on exit.
    """

    def __init__(
        self,
        app: Akadze,
        *,
        queues: Sequence[str] | None = None,
        slots: int = 10,
        fair: bool = False,
        lease: timedelta | float = timedelta(seconds=30),
        shutdown_timeout: timedelta | float = 10.0,
        poll_interval: timedelta | float = 1.0,
        listen: bool = True,
        worker_id: str | None = None,
        clock: Clock | None = None,
        database_url: str | None = None,
        tasks: Collection[str] | None = None,
        maintenance: bool = True,
        pool_size: int | None = None,
        durable_claims: bool = False,
    ) -> None:
        from .app import Akadze

        if not isinstance(app, Akadze):
            raise ConfigurationError(f"Worker needs an Akadze app, got {type(app).__name__}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigurationError(f"slots must be a positive integer, got {slots!r}")
        names = sorted(app.tasks) if tasks is None else sorted(set(tasks))
        if isinstance(tasks, str):
            raise ConfigurationError("tasks must be a collection of task names")
        for name in names:
            app.get_task(name)  # UnknownTask for a name the app does not have
        if not names:
            raise ConfigurationError("the app has no tasks registered: nothing to run")
        if queues is None:
            queues = sorted({app.tasks[name].queue for name in names})
        if isinstance(queues, str):
            queues = [queues]
        queues = list(dict.fromkeys(queues))
        if not queues or not all(isinstance(q, str) and q for q in queues):
            raise ConfigurationError("queues must be a non-empty list of queue names")
        self.app = app
        self.queues = queues
        self.slots = slots
        self.fair = bool(fair)
        self.lease = _seconds(lease, "lease")
        if self.lease < 0.1:
            raise ConfigurationError("lease must be at least 0.1 s")
        self.shutdown_timeout = _seconds(shutdown_timeout, "shutdown_timeout")
        self.poll_interval = _seconds(poll_interval, "poll_interval")
        if self.poll_interval <= 0:
            raise ConfigurationError("poll_interval must be positive")
        self.listen = bool(listen)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self._url = database_url or app.database_url
        self._task_names = names
        self._maintenance = maintenance
        self._pool_size = pool_size or 3 + 4
        self._durable_claims = bool(durable_claims)
        #: Finished runs by kind (succeeded, retried, snoozed, failed, cancelled, given_back),
        #: plus "lost" for outcomes that fencing discarded.
        self.counts: Counter[str] = Counter()

        self._queues = {name: _Queue(name) for name in queues}
        self._running: dict[int, _Run] = {}
        self._pending: list[outcomes.Finish] = []
        self._flush_wanted = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._registered = asyncio.Event()
        self._ready = asyncio.Event()
        self._heartbeat_tried = asyncio.Event()
        self._cancel_poll_now = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._settled = asyncio.Event()
        self._stop_count = 0
        self._stopping = False
        self._fenced = False
        self._crash: BaseException | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._random = random.Random()
        self._trouble = Trouble(logger)
        self._max_pending = max(2 * slots * len(queues), 1_000)
        self._pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._claim_pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._sync_pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._sync_pool_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._listener: Listener | None = None
        self._background: list[asyncio.Task[None]] = []
        self._run_task: asyncio.Task[None] | None = None
        self._used = False

    # -- Runtime (for RunContext) ---------------------------------------------------------

    def sql_now(self) -> datetime | None:
        """The time to hand to SQL: the injected clock's, else None (the database's)."""
        if self.clock is None or isinstance(self.clock, SystemClock):
            return None
        return self.clock.now()

    def _wall_now(self) -> datetime:
        return (self.clock or self.app.clock).now()

    @asynccontextmanager
    async def async_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise WorkerError("the worker is not running")
        async with self._pool.connection() as conn:
            yield conn

    @contextmanager
    def sync_connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._sync_pool_lock:
            if self._sync_pool is None:
                self._sync_pool = psycopg_pool.ConnectionPool(
                    self._url, min_size=0, max_size=4, open=True, timeout=30,
                    kwargs={"autocommit": True, "application_name": "akadze-worker"},
                    name="akadze-worker-sync",
                )
            pool = self._sync_pool
        with pool.connection() as conn:
            yield conn

    # -- public ---------------------------------------------------------------------

    @property
    def running(self) -> int:
        """How many jobs run right now."""
        return len(self._running)

    def stop(self) -> None:
        """Ask the worker to stop: the first call is graceful (stop claiming, wait up to
        ``shutdown_timeout`` for running jobs, give the rest back); a second call stops
        at once, giving back what it can. Safe to call from any thread or a signal
        handler."""
        loop = self._loop
        if loop is not None and self._loop_thread != threading.get_ident():
            loop.call_soon_threadsafe(self._stop_in_loop)
            return
        self._stop_in_loop()

    async def __aenter__(self) -> Worker:
        self._run_task = asyncio.create_task(self.run(), name=f"akadze-worker {self.worker_id}")
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({self._run_task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if self._run_task.done():
            ready.cancel()
            self._run_task.result()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if self._run_task is not None:
            await self._run_task

    async def run(self, *, install_signal_handlers: bool = False) -> None:
        """Run until :meth:`stop` (or, with ``install_signal_handlers``, SIGINT/SIGTERM:
        the first graceful, a second immediate). Raises WorkerError when the worker
        cannot run at all (schema missing) or crashed."""
        self._begin()
        loop = asyncio.get_running_loop()
        signals: list[signal.Signals] = []
        if install_signal_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, self.stop)
                    signals.append(sig)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - not Unix
                    pass
        try:
            await self._open()
            logger.info(
                "worker %s starting on %s: queues %s, %d slot%s each%s%s",
                self.worker_id, describe(self._url), ", ".join(self.queues), self.slots,
                "" if self.slots == 1 else "s", ", fair" if self.fair else "",
                "" if self.listen else ", polling only",
                extra={"worker_id": self.worker_id},
            )
            self._spawn(self._heartbeat_loop(), "heartbeat")
            self._spawn(self._flush_loop(), "outcomes")
            self._spawn(self._cancel_poll_loop(), "cancel poll")
            if self._maintenance:
                self._spawn(self._maintenance_loop(), "maintenance")
            if self.listen:
                self._listener = Listener(
                    self._url, on_queue=self._on_notify, on_cancel=self._on_cancel,
                    on_connected=self._on_listener_connected, trouble=self._trouble,
                    connect_kwargs={"application_name": "akadze-worker-listen"},
                )
                self._spawn(self._listener.run(), "listener")
            for queue in self._queues.values():
                self._spawn(self._queue_loop(queue), f"claims {queue.name}")
            self._spawn(self._ready_when_started(), "ready")
            await self._stop_requested.wait()
            await self._shutdown()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self._end()
        if self._crash is not None:
            raise WorkerError(f"worker {self.worker_id} stopped: {self._crash}") from self._crash
        logger.info("worker %s stopped", self.worker_id, extra={"worker_id": self.worker_id})

    async def drain(self, *, max_runs: int = 10_000) -> dict[str, int]:
        """Run every ready job of the worker's queues to completion, then return the
        counts of finished runs by kind. Jobs that become ready meanwhile (a
        follow-up job, a retry without delay) are run too, up to ``max_runs`` runs.
        Used by :func:`akadze.testing.drain`."""
        self._begin()
        try:
            await self._open()
            await self._register(first=True)
            runs = 0
            while runs < max_runs:
                claimed = 0
                for queue in self._queues.values():
                    free = min(self.slots - queue.busy, max_runs - runs - claimed)
                    if free <= 0:
                        continue
                    jobs = await self._claim(queue, free)
                    for job in jobs:
                        self._start(queue, job)
                    claimed += len(jobs)
                tasks = [run.aio for run in self._running.values() if run.aio is not None]
                if tasks:
                    await asyncio.wait(tasks)
                await self._flush_everything(raise_errors=True)
                runs += claimed
                if claimed == 0:
                    break
            async with self.async_connection() as conn:
                await leases.unregister(conn, self.worker_id)
        finally:
            await self._end()
        return {kind: self.counts.get(kind, 0) for kind in (
            outcomes.SUCCEEDED, outcomes.RETRIED, outcomes.SNOOZED, outcomes.FAILED,
            outcomes.CANCELLED, outcomes.GIVEN_BACK)}

    # -- lifecycle ----------------------------------------------------------------------

    def _begin(self) -> None:
        if self._used:
            raise WorkerError("a Worker runs once; create a new one")
        self._used = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    async def _open(self) -> None:
        self._pool = psycopg_pool.AsyncConnectionPool(
            self._url, min_size=1, max_size=self._pool_size, open=False,
            timeout=max(0.2, min(5.0, self.lease / 3)),
            check=psycopg_pool.AsyncConnectionPool.check_connection,
            kwargs={"autocommit": True, "application_name": "akadze-worker"},
            name="akadze-worker",
        )
        await self._pool.open(wait=False)
        # Claims have connections of their own. Unless durable_claims is set, their
        # commits do not wait for the WAL flush (synchronous_commit off, these
        # connections only): a claim is on disk with the next durable commit (the
        # job's outcome, at the latest), and a server crash can only undo a claim whose
        # outcome was not durable yet, so the job runs again, as after any crash
        # during a run. Delivery stays at least once; pick-up does not wait for fsync.
        claim_kwargs: dict[str, Any] = {"autocommit": True, "application_name": "akadze-worker"}
        if not self._durable_claims:
            claim_kwargs["options"] = "-c synchronous_commit=off"
        self._claim_pool = psycopg_pool.AsyncConnectionPool(
            self._url, min_size=1, max_size=len(self.queues) + 1, open=False,
            timeout=max(0.2, min(5.0, self.lease / 3)),
            # No check on checkout (a round trip per claim): a broken connection fails
            # one claim, which is retried at once and then reconciled.
            kwargs=claim_kwargs, name="akadze-worker-claims",
        )
        await self._claim_pool.open(wait=False)
        if any(not self.app.tasks[name].is_async for name in self._task_names):
            self._executor = ThreadPoolExecutor(
                max_workers=self.slots * len(self.queues), thread_name_prefix="akadze-task"
            )

    async def _end(self) -> None:
        background, self._background = self._background, []
        for task in background:
            task.cancel()
        runs = [run.aio for run in self._running.values()
                if run.aio is not None and not run.aio.done()]
        for task in runs:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if runs:
            await asyncio.wait(runs, timeout=1.0)
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for pool in (self._claim_pool, self._pool):
            if pool is not None:
                await pool.close(timeout=1.0)
        if self._sync_pool is not None:
            await asyncio.to_thread(self._sync_pool.close)

    def _spawn(self, coro: Any, name: str) -> None:
        self._background.append(asyncio.create_task(self._supervised(coro, name), name=name))

    async def _supervised(self, coro: Any, name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if self._crash is None:
                self._crash = exc
            if not isinstance(exc, WorkerError):
                logger.critical("worker %s: %s crashed", self.worker_id, name, exc_info=exc)
            self._stop_count = max(self._stop_count, 1)
            self._force.set()
            self._stop_requested.set()
            self._wake_all()

    async def _ready_when_started(self) -> None:
        await self._heartbeat_tried.wait()
        if self._listener is not None:
            await self._listener.tried.wait()
        self._ready.set()

    def _stop_in_loop(self) -> None:
        self._stop_count += 1
        if self._stop_count == 1:
            logger.info("worker %s: stopping (running jobs get %g s to finish)",
                        self.worker_id, self.shutdown_timeout)
        else:
            logger.warning("worker %s: stopping now", self.worker_id)
            self._force.set()
        self._stopping = True
        self._stop_requested.set()
        self._wake_all()

    def _wake_all(self) -> None:
        for queue in self._queues.values():
            queue.wake.set()
            queue.freed.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up when a stop is requested."""
        await self._wait(self._stop_requested, seconds)

    # -- claiming ------------------------------------------------------------------------

    async def _claim(self, queue: _Queue, free: int) -> list[ClaimedJob]:
        if self._claim_pool is None:
            raise WorkerError("the worker is not running")
        async with self._claim_pool.connection() as conn:
            jobs: list[ClaimedJob] = await claim(
                conn, queue=queue.name, slots=free, fair=self.fair, worker_id=self.worker_id,
                tasks=self._task_names, app=self.app, now=self.sql_now(),
            )
        return jobs

    def _blocked(self, queue: _Queue) -> bool:
        return (
            queue.busy >= self.slots
            or self._fenced
            or len(self._pending) >= self._max_pending
        )

    async def _queue_loop(self, queue: _Queue) -> None:
        loop = asyncio.get_running_loop()
        where = f"claim on queue {queue.name!r}"
        while not self._registered.is_set():
            if self._stopping:
                return
            await self._wait(self._registered, 0.5)
        while not self._stopping:
            if self._blocked(queue):
                queue.freed.clear()
                await self._wait(queue.freed, self.poll_interval)
                continue
            queue.wake.clear()
            free = self.slots - queue.busy
            try:
                if queue.suspect:
                    await self._reconcile(queue)
                jobs = await self._claim(queue, free)
            except Exception as exc:
                queue.suspect = True
                if self._stopping:
                    return
                delay = backoff.reconnect_delay(self._trouble.failures(where) + 1,
                                                self._random.random())
                self._trouble.failed(where, exc, delay)
                await self._sleep(delay)
                continue
            self._trouble.recovered(where)
            queue.last_claim = loop.time()
            if self._stopping:  # claimed during a stop: hand them straight back
                for job in jobs:
                    self._record(None, outcomes.given_back(job))
                return
            for job in jobs:
                self._start(queue, job)
            if len(jobs) >= free:
                # The queue may hold more: claim again as soon as slots free up; one
                # pass of the loop lets every run that is finishing now finish first.
                await asyncio.sleep(0)
                continue
            # Drained: wait for a notification, the polling timer or a known due time.
            await self._wait_drained(queue)
            if not self._stopping and queue.wake.is_set():
                # A notification: let a burst of enqueues land, then claim them together.
                gap = DEBOUNCE - (loop.time() - queue.last_claim)
                if gap > 0:
                    await asyncio.sleep(gap)

    async def _reconcile(self, queue: _Queue) -> None:
        """Give back the jobs a lost claim reply left running for this worker.

        Runs in the queue's own loop, so no claim of this queue is in flight: a job
        of the queue running for this worker that is neither running here nor
        waiting for its outcome to be written was claimed unseen."""
        async with self.async_connection() as conn:
            cur = await conn.cursor(row_factory=job_rows).execute(
                queries.get("worker_running_in_queue"),
                {"worker_id": self.worker_id, "queue": queue.name},
            )
            jobs = await cur.fetchall()
        known = set(self._running) | {finish.job.id for finish in self._pending}
        for job in jobs:
            if job.id not in known:
                logger.warning(
                    "job %d: claimed by a claim whose reply was lost; giving it back",
                    job.id, extra={"job_id": job.id, "queue": queue.name})
                self._record(None, outcomes.given_back(job))
        queue.suspect = False

    async def _wait_drained(self, queue: _Queue) -> None:
        """Wait for a notification, the polling timer, or the earliest known due time
        (which may move earlier while waiting)."""
        loop = asyncio.get_running_loop()
        while not queue.wake.is_set() and not self._stopping:
            queue.retimer.clear()
            timeout = self._poll_timeout(queue)
            began = loop.time()
            waits = [asyncio.ensure_future(queue.wake.wait()),
                     asyncio.ensure_future(queue.retimer.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            if not queue.retimer.is_set() or loop.time() - began >= timeout:
                return

    def _poll_timeout(self, queue: _Queue) -> float:
        loop = asyncio.get_running_loop()
        timeout = self.poll_interval * self._random.uniform(0.8, 1.2)
        now = loop.time()
        while queue.due and queue.due[0] <= now:
            heapq.heappop(queue.due)
        if queue.due:
            timeout = min(timeout, queue.due[0] - now + 0.001)
        return max(timeout, 0.0)

    async def _wait(self, event: asyncio.Event, seconds: float) -> None:
        """Wait for ``event``, at most ``seconds``.

        asyncio.timeout, not asyncio.wait_for: on Python 3.11, wait_for loses a
        cancellation that arrives as the awaited event fires or as the timeout
        expires (it returns, or raises TimeoutError, instead: CPython gh-86296);
        a background loop then never ends, and the worker's shutdown waited for
        it forever."""
        if event.is_set():
            return
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()

    def _on_notify(self, queue_name: str) -> None:
        queue = self._queues.get(queue_name)
        if queue is not None:
            queue.wake.set()

    def _on_listener_connected(self) -> None:
        # Notifications sent while nobody listened are lost: look at every queue, and
        # at pending cancellations, once.
        self._wake_all()
        self._cancel_poll_now.set()


__all__ = ["Worker", "is_transient"]
