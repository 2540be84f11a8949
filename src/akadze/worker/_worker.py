"""The worker: one asyncio process that claims jobs and runs them.

:class:`Worker` composes collaborators that share one :class:`~._state.WorkerState`
and call each other only through the callbacks wired here:

- :class:`~._connections.Connections`: every database connection the worker has;
- :class:`~._claims.ClaimLoop` (one per queue): claims into free slots, waits on
  :class:`~._wakeup.Wakeup` (notifications from the :class:`~._listener.Listener`,
  the polling timer, known due times);
- :class:`~._runner.Runner`: runs each claimed job (async on the loop, plain in
  a thread), decides its outcome, ends runs early when asked;
- :class:`~._flusher.OutcomeFlusher`: writes outcomes in fenced batches;
- :class:`~._handoffs.HandOffs`: after an outcome write, starts the next jobs of
  the limited keys whose runs ended, in the slots they left;
- :class:`~._leases.LeaseKeeper`: heartbeat and self-fencing;
- :class:`~._ownership.OwnershipCheck`: after a lost connection, which runs lost
  their jobs (checked right after the lease is renewed);
- :class:`~._cancellation.CancelWatcher`: cancellation requests;
- :class:`~._maintenance.MaintenanceLoop`: rescue, schedules, pruning;
- :func:`~._shutdown.shut_down`: the graceful and the forced stop.

The worker itself owns the lifecycle: it opens and closes, supervises the
background loops (one crashing stops the worker), and takes stop requests.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Collection, Coroutine, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from .. import outcomes
from ..app import Akadze
from ..clock import Clock
from ..database import describe
from ..errors import WorkerError
from ._cancellation import CancelWatcher
from ._claims import ClaimLoop
from ._connections import Connections
from ._events import EventCallback
from ._flusher import OutcomeFlusher
from ._handoffs import HandOffs
from ._leases import CHECK_RUNS, LeaseKeeper
from ._listener import Listener
from ._maintenance import MaintenanceLoop
from ._ownership import OwnershipCheck
from ._progress import ProgressWriter
from ._runner import Runner, TaskRuntime
from ._settings import build_settings
from ._shutdown import shut_down
from ._state import WorkerState, cancel_until_done
from ._wakeup import Wakeup

logger = logging.getLogger("akadze.worker")

#: The kinds of finished runs that ``drain`` reports.
DRAIN_KINDS = (outcomes.SUCCEEDED, outcomes.RETRIED, outcomes.SNOOZED, outcomes.FAILED,
               outcomes.CANCELLED, outcomes.GIVEN_BACK)



class Worker:
    """Claims and runs the jobs of ``queues``.

    ``slots``: jobs run at once per queue. ``fair``: fair claim order across
    ``limit_key`` groups. ``lease``: how long the worker's heartbeat stays valid.
    ``shutdown_timeout``: how long a graceful stop waits for running jobs before
    giving them back. ``poll_interval``: the polling period (jittered) that backs
    up notifications. ``listen=False`` turns LISTEN/NOTIFY off (PgBouncer in
    transaction pooling mode). ``clock``: inject database time (tests).
    ``durable_claims=True`` makes each claim wait for its WAL flush (by default claims
    commit asynchronously, outcomes durably; see docs/explanation/job-states.md).
    ``on_event``: a callback that gets a :class:`~akadze.worker.WorkerEvent` at each
    observable moment (ready, listening, claimed, idle, fenced, ...; see
    docs/reference/worker.md). ``connections``: the most server connections this
    worker opens, all together (default 3, plus 1 per 10 slots over all its queues;
    ``pool_size`` is the older name for the general pool alone). ``transaction_pooling``:
    ``database_url`` goes through a pooler in transaction mode (PgBouncer): no
    server-side prepared statements, and LISTEN only on ``listen_url`` (a direct URL),
    polling without one. ``hand_off=False``: a run of a key with ``max_running`` that
    ends leaves its slot to the next claim instead of starting the key's next job
    itself (docs/explanation/limits.md, "Hand-offs").

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
        on_event: EventCallback | None = None,
        connections: int | None = None,
        listen_url: str | None = None,
        transaction_pooling: bool = False,
        hand_off: bool = True,
    ) -> None:
        settings = build_settings(
            app, queues=queues, slots=slots, fair=fair, lease=lease,
            shutdown_timeout=shutdown_timeout, poll_interval=poll_interval, listen=listen,
            worker_id=worker_id, clock=clock, database_url=database_url, tasks=tasks,
            maintenance=maintenance, pool_size=pool_size, durable_claims=durable_claims,
            on_event=on_event, connections=connections, listen_url=listen_url,
            transaction_pooling=transaction_pooling, hand_off=hand_off,
        )
        self.app = app
        self.queues = list(settings.queues)
        self.slots = settings.slots
        self.fair = settings.fair
        self.lease = settings.lease
        self.shutdown_timeout = settings.shutdown_timeout
        self.poll_interval = settings.poll_interval
        self.listen = settings.listen
        self.worker_id = settings.worker_id
        self.clock = settings.clock
        self._settings = settings

        state = self._state = WorkerState(settings)
        #: Finished runs by kind (succeeded, retried, snoozed, failed, cancelled, given_back),
        #: plus "lost" for outcomes that fencing discarded.
        self.counts = state.counts
        owner = self._connections = Connections(settings)
        self._wakeup = Wakeup(settings.queues, poll_interval=settings.poll_interval,
                              rand=state.random, quiet_poll=settings.quiet_poll,
                              listening=self._listening)
        self._hand_offs = HandOffs(
            state, blocked=lambda queue: self._claim_loops[queue].blocked,
            deliver=lambda queue, jobs: self._claim_loops[queue].take_handed(jobs),
            suspect=lambda queue: self._claim_loops[queue].suspect(),
            lose=lambda ids, why: self._lose_runs(ids, why))
        self._flusher = OutcomeFlusher(state, owner, on_due=self._wakeup.due_at,
                                       on_room=self._key_room, hand_offs=self._hand_offs)
        self._progress = ProgressWriter(state, owner)
        self._runner = Runner(state, TaskRuntime(state, owner, self._progress),
                              submit=self._flusher.submit)
        self._ownership = OwnershipCheck(state, lose=self._lose_runs)
        state.trouble.on_recovered = self._reconnected
        self._listened = False
        self._cancels = CancelWatcher(state, owner, cancel=self._cancel,
                                      listening=self._listening, holds=self._holds)
        self._listener = Listener(
            owner.listen_connection, on_queue=self._wakeup.notify,
            on_cancel=self._cancels.requested, on_connected=self._on_listening,
            trouble=state.trouble, on_lost=self._wakeup.retime_all,
        ) if settings.listen else None
        self._leases = LeaseKeeper(
            state, owner, on_fence=self._give_back_all, on_unfence=self._wake_all,
            ownership=self._ownership,
            lend=self._listener.lent if self._listener is not None else None)
        self._claim_loops = {
            name: ClaimLoop(name, state, owner, self._wakeup,
                            start=self._runner.start, hand_back=self._runner.hand_back,
                            cancel_unstarted=self._runner.cancel_unstarted,
                            backlogged=self._flusher.backlogged, known=self._known_jobs,
                            quiet=lambda: self._hand_offs.quiet)
            for name in settings.queues
        }
        self._maintenance = MaintenanceLoop(state, owner) if maintenance else None

        self._ready = asyncio.Event()
        self._stop_count = 0
        self._crash: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._background: list[asyncio.Task[None]] = []
        self._run_task: asyncio.Task[None] | None = None
        self._used = False

    # -- public ---------------------------------------------------------------------

    @property
    def running(self) -> int:
        """How many jobs run right now."""
        return len(self._state.running)

    @property
    def threads_running(self) -> int:
        """How many plain (non-async) task functions are still running in threads.
        After :meth:`run` returns these are runs that were given back: a thread cannot
        be interrupted, so the function goes on while its job is queued again."""
        return self._runner.threads_running

    def _lose_runs(self, job_ids: list[int], why: str) -> list[int]:
        """Runs the database no longer has claimed by them (:meth:`Runner.lose`: the
        ownership check's, and the hand-offs' for a reservation given back); the
        reservations that followed them go back at the next write."""
        for job_id in job_ids:
            run = self._state.running.get(job_id)
            if run is not None and not run.recorded:
                self._hand_offs.drop(run.queue, run.job.limit_key)
        return self._runner.lose(job_ids, why)

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
        settings, state = self._settings, self._state
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
                self.worker_id, describe(settings.url), ", ".join(self.queues), self.slots,
                "" if self.slots == 1 else "s", ", fair" if self.fair else "",
                "" if self.listen else ", polling only",
                extra={"worker_id": self.worker_id},
            )
            self._spawn(self._leases.run(), "heartbeat")
            self._spawn(self._flusher.run(), "outcomes")
            self._spawn(self._cancels.run(), "cancel poll")
            self._spawn(self._progress.run(), "progress")
            if self._maintenance is not None:
                self._spawn(self._maintenance.run(), "maintenance")
            if self._listener is not None:
                self._spawn(self._listener.run(), "listener")
            for claims in self._claim_loops.values():
                self._spawn(claims.run(), f"claims {claims.queue}")
            self._spawn(self._ready_when_started(), "ready")
            state.events.emit("started")
            await state.stop_requested.wait()
            state.stopping = True
            for claims in self._claim_loops.values():  # claimed ahead, never started
                claims.give_back_buffered()
            self._wake_all()
            await shut_down(state, self._runner, self._flusher, self._leases)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self._end()
            state.events.emit("stopped")
        if self._crash is not None:
            raise WorkerError(f"worker {self.worker_id} stopped: {self._crash}") from self._crash
        logger.info("worker %s stopped", self.worker_id, extra={"worker_id": self.worker_id})

    async def wait_idle(self) -> None:
        """Wait until no job runs here and every outcome is written."""
        state = self._state
        while state.running or self._flusher.pending:
            state.settled.clear()
            await state.settled.wait()

    async def drain(self, *, max_runs: int = 10_000) -> dict[str, int]:
        """Run every ready job of the worker's queues to completion, then return the
        counts of finished runs by kind. Jobs that become ready meanwhile (a
        follow-up job, a retry without delay) are run too, up to ``max_runs`` runs.
        Used by :func:`akadze.testing.drain`."""
        self._begin()
        try:
            await self._open()
            await self._leases.register(first=True)
            runs = 0
            while runs < max_runs:
                claimed = 0
                for claims in self._claim_loops.values():
                    free = min(claims.free, max_runs - runs - claimed)
                    if free <= 0:
                        continue
                    jobs = await claims.claim(free)
                    claims.hand_over(jobs)
                    claimed += len(jobs)
                tasks = self._runner.tasks()
                if tasks:
                    await asyncio.wait(tasks)
                await self._flusher.flush_all(raise_errors=True)
                runs += claimed
                if claimed == 0:
                    break
            await self._leases.unregister()
        finally:
            await self._end()
        return {kind: self.counts.get(kind, 0) for kind in DRAIN_KINDS}

    # -- lifecycle ----------------------------------------------------------------------

    def _begin(self) -> None:
        if self._used:
            raise WorkerError("a Worker runs once; create a new one")
        self._used = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    async def _open(self) -> None:
        await self._connections.open()
        self._runner.open()

    async def _end(self) -> None:
        background, self._background = self._background, []
        runs = [task for task in self._runner.tasks() if not task.done()]
        for task in runs:
            task.cancel()
        await cancel_until_done(background)
        if runs:
            await asyncio.wait(runs, timeout=1.0)
        self._leases.close()
        self._runner.close()
        await self._connections.close()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._background.append(asyncio.create_task(self._supervised(coro, name), name=name))

    async def _supervised(self, coro: Coroutine[Any, Any, None], name: str) -> None:
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
            self._state.force.set()
            self._state.stop_requested.set()
            self._wake_all()

    async def _ready_when_started(self) -> None:
        await self._leases.tried.wait()
        if self._listener is not None:
            await self._listener.tried.wait()
        self._ready.set()
        self._state.events.emit("ready")

    def _stop_in_loop(self) -> None:
        state = self._state
        self._stop_count += 1
        if self._stop_count == 1:
            logger.info("worker %s: stopping (running jobs get %g s to finish)",
                        self.worker_id, self.shutdown_timeout)
            state.events.emit("stopping", detail="graceful")
        else:
            logger.warning("worker %s: stopping now", self.worker_id)
            state.force.set()
            state.events.emit("stopping", detail="now")
        state.stopping = True
        state.stop_requested.set()
        self._wake_all()

    # -- wiring -------------------------------------------------------------------------

    def _wake_all(self) -> None:
        """Every claim loop looks again (a stop, a renewed lease, a new listener); the
        flusher gives back the reservations it let go meanwhile."""
        self._wakeup.notify_all()
        self._state.unblock()
        self._flusher.wake()

    def _listening(self) -> bool:
        return self._listener is not None and self._listener.listening

    def _reconnected(self, where: str) -> None:
        """A database call that had failed works again: the connection may have been
        lost, and with it claims (a crash) or leases (a partition)."""
        if where not in ("heartbeat", CHECK_RUNS):  # the lease keeper sees to those
            self._ownership.want(f"{where} worked again")

    def _on_listening(self) -> None:
        # Notifications sent while nobody listened are lost: look at every queue, and
        # at pending cancellations, once.
        if self._listened:
            self._ownership.want("the LISTEN connection was made again")
        self._listened = True
        self._wake_all()
        self._cancels.poll_soon()
        self._state.events.emit("listening")

    def _key_room(self, queue: str) -> None:
        """This worker wrote the outcome of a job with a limit key: the key may have
        room. Listening, the notification of migration 0010 says so a moment later
        (waking here as well would claim twice); without LISTEN, claim again now."""
        if not self._listening():
            self._wakeup.notify(queue)

    def _give_back_all(self) -> list[int]:
        """Fenced: give back every unfinished run and every job claimed ahead, and
        let go of the reserved jobs."""
        self._hand_offs.forget()
        given = self._runner.give_back_unfinished()
        for claims in self._claim_loops.values():
            given += claims.give_back_buffered()
        return given

    def _cancel(self, job_id: int) -> None:
        """A cancellation request: a job claimed ahead ends before it starts, a
        running one is ended by the runner."""
        if not any(claims.cancel_buffered(job_id) for claims in self._claim_loops.values()):
            self._runner.cancel(job_id)

    def _holds(self, job_id: int) -> bool:
        """Whether ``job_id`` runs here or waits here, claimed ahead."""
        return job_id in self._state.running or any(
            job_id in claims.buffered_ids() for claims in self._claim_loops.values())

    def _known_jobs(self) -> set[int]:
        """The jobs this worker knows it has: running, or waiting for their outcome."""
        return set(self._state.running) | self._flusher.pending_ids()
