"""Running claimed jobs: one asyncio task per run, plain functions in threads, outcomes
recorded and written in batches.

This is the part of :class:`akadze.worker.Worker` that runs jobs (a mixin, so that
the worker module stays about its lifecycle and claim loops).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import logging
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
import pydantic

from . import backoff, leases, outcomes
from .arguments import describe_validation as _describe_validation
from .errors import JobLost
from .hooks import call_run_hooks
from .jobs import ClaimedJob
from .resilience import Trouble, first_line
from .runs import RunContext, _current
from .tasks import Task

if TYPE_CHECKING:
    from .app import Akadze
    from .wakeup import Listener
    from .worker import _Queue

logger = logging.getLogger("akadze.worker")

#: Most finishes written by one statement.
MAX_BATCH = 5_000
#: Seconds a graceful stop spends writing the last outcomes.
FINAL_FLUSH_TIMEOUT = 5.0


@dataclass(slots=True, eq=False)
class _Run:
    job: ClaimedJob
    task: Task[Any]
    ctx: RunContext
    queue: str
    started: float
    aio: asyncio.Task[None] | None = None
    body_done: bool = False
    recorded: bool = False


class Execution:
    """Runs jobs and records their outcomes (mixed into Worker)."""

    app: Akadze
    worker_id: str
    poll_interval: float
    counts: Counter[str]
    _queues: dict[str, _Queue]
    _running: dict[int, _Run]
    _pending: list[outcomes.Finish]
    _flush_wanted: asyncio.Event
    _cancel_poll_now: asyncio.Event
    _write_lock: asyncio.Lock
    _settled: asyncio.Event
    _force: asyncio.Event
    _random: random.Random
    _trouble: Trouble
    _executor: ThreadPoolExecutor | None
    _listener: Listener | None
    _stopping: bool
    _registered: asyncio.Event
    shutdown_timeout: float

    if TYPE_CHECKING:  # provided by Worker

        def sql_now(self) -> datetime | None: ...

        def _wall_now(self) -> datetime: ...

        def async_connection(
            self,
        ) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

        def sync_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        async def _wait(self, event: asyncio.Event, seconds: float) -> None: ...

        def _wake_all(self) -> None: ...

    # -- running -------------------------------------------------------------------------

    def _start(self, queue: _Queue, job: ClaimedJob) -> None:
        task = self.app.tasks.get(job.task)
        if task is None:  # cannot happen: the claim filters on registered names
            self._record(None, outcomes.given_back(job))
            return
        ctx = RunContext(job, self)
        run = _Run(job, task, ctx, queue.name, asyncio.get_running_loop().time())
        self._running[job.id] = run
        queue.busy += 1
        run.aio = asyncio.create_task(self._execute(run))

    async def _execute(self, run: _Run) -> None:
        job, task, ctx = run.job, run.task, run.ctx
        _current.set(ctx)
        exc: BaseException | None = None
        result: object = None
        timed_out: float | None = None
        try:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("job %d (%s) attempt %d started", job.id, job.task, job.attempt,
                             extra=self._extra(run))
            try:
                if self.app.before_run_hooks:
                    await call_run_hooks(self.app.before_run_hooks, job)
                try:
                    kwargs = task.load_args(job.args)
                except pydantic.ValidationError as invalid:
                    message = "stored arguments are invalid: " + _describe_validation(
                        job.task, invalid)
                    run.body_done = True
                    self._record(run, outcomes.invalid_args(job, self._wall_now(), message))
                    return
                if task.is_async:
                    result, timed_out = await self._call_async(run, kwargs)
                else:
                    result = await self._run_in_thread(run, kwargs)
            except asyncio.CancelledError:
                if ctx.stop_reason is None:
                    raise  # not ours (the worker is being torn down)
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
            except JobLost:
                ctx.stop_reason = ctx.stop_reason or "lost"
            except Exception as raised:
                exc = raised
            run.body_done = True
            if run.recorded:
                return
            if ctx.completed:
                ctx.outcome = outcomes.SUCCEEDED
                self.counts[outcomes.SUCCEEDED] += 1
                run.recorded = True
                self._log_finish(run, outcomes.SUCCEEDED, None)
                return
            if ctx.stop_reason == "lost":
                run.recorded = True
                self.counts["lost"] += 1
                logger.warning("job %d (%s): this run lost the job; its outcome is dropped",
                               job.id, job.task, extra=self._extra(run))
                return
            if ctx.cancel_requested:
                finish: outcomes.Finish = outcomes.cancelled(
                    job, self._wall_now(), "cancellation was requested while it ran")
            else:
                finish, warning = outcomes.decide(
                    job, exc, result, at=self._wall_now(), draw=self._random.random(),
                    custom_backoff=task.backoff, timeout=timed_out,
                )
                if warning:
                    logger.warning("job %d: %s", job.id, warning, extra=self._extra(run))
            self._record(run, finish, exc)
        finally:
            run.body_done = True
            if self.app.after_run_hooks:
                try:
                    await call_run_hooks(self.app.after_run_hooks, job)
                except asyncio.CancelledError:
                    pass
                except Exception as hook_error:
                    logger.error("after_run hook failed for job %d: %s", job.id, hook_error,
                                 exc_info=hook_error, extra=self._extra(run))
            self._release(run)

    async def _call_async(
        self, run: _Run, kwargs: dict[str, Any]
    ) -> tuple[object, float | None]:
        """Await the task; ``(result, None)``, or ``(None, timeout)`` when it ran over."""
        timeout = run.task.timeout
        if timeout is None:
            return await run.task.fn(**kwargs), None
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await run.task.fn(**kwargs), None
        except TimeoutError:
            if deadline.expired():
                return None, timeout
            raise

    async def _run_in_thread(self, run: _Run, kwargs: dict[str, Any]) -> object:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        future = loop.run_in_executor(
            self._executor, context.run, functools.partial(run.task.fn, **kwargs))
        try:
            if run.task.timeout is None:
                return await asyncio.shield(future)
            async with asyncio.timeout(run.task.timeout):  # not wait_for: Worker._wait
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done():
                raise
            # The thread cannot be interrupted: the run ends now (timeout), the slot
            # stays taken until the function returns, and what it returns is dropped.
            finish, _ = outcomes.decide(
                run.job, None, None, at=self._wall_now(), draw=self._random.random(),
                custom_backoff=run.task.backoff, timeout=run.task.timeout,
            )
            self._abandon(run, finish, "timeout")
            await _quietly(future)
            return None
    async def wait_idle(self) -> None:
        """Wait until no job runs here and every outcome is written."""
        while self._running or self._pending:
            self._settled.clear()
            await self._settled.wait()

    def _abandon(self, run: _Run, finish: outcomes.Finish, reason: str) -> None:
        """End a run before its function does: record ``finish`` now, tell the task
        (``current().should_stop``), and interrupt it when it is async."""
        if run.recorded:
            return
        run.ctx.stop_reason = run.ctx.stop_reason or reason
        self._record(run, finish)
        if run.aio is not None and not run.body_done and run.task.is_async:
            run.aio.cancel()

    def _release(self, run: _Run) -> None:
        if self._running.get(run.job.id) is run:
            del self._running[run.job.id]
        queue = self._queues[run.queue]
        queue.busy -= 1
        queue.freed.set()
        self._settled.set()

    def _record(
        self, run: _Run | None, finish: outcomes.Finish, exc: BaseException | None = None
    ) -> None:
        if run is not None:
            if run.recorded:
                return
            run.recorded = True
            run.ctx.outcome = finish.kind
        self.counts[finish.kind] += 1
        self._pending.append(finish)
        self._flush_wanted.set()
        if run is not None:
            self._log_finish(run, finish.kind, finish, exc)

    def _due_at(self, queue_name: str, when: float) -> None:
        """A job of ``queue_name`` becomes ready at loop time ``when`` (a retry or a
        snooze written just now: the row's run_at is no later than that)."""
        queue = self._queues.get(queue_name)
        if queue is None:
            return
        heapq.heappush(queue.due, when + 0.001)
        if queue.due[0] == when + 0.001:
            queue.retimer.set()  # earlier than what the queue's loop waits for

    def _extra(self, run: _Run, **more: Any) -> dict[str, Any]:
        job = run.job
        return {"job_id": job.id, "task": job.task, "queue": job.queue, "key": job.limit_key,
                "attempt": job.attempt, "worker_id": self.worker_id, **more}

    def _log_finish(
        self, run: _Run, kind: str, finish: outcomes.Finish | None,
        exc: BaseException | None = None,
    ) -> None:
        level = logging.INFO if kind in (outcomes.SUCCEEDED, outcomes.SNOOZED) else (
            logging.WARNING if kind in (outcomes.RETRIED, outcomes.FAILED) else logging.INFO)
        if not logger.isEnabledFor(level):
            return
        duration = asyncio.get_running_loop().time() - run.started
        job = run.job
        detail = ""
        if finish is not None and finish.state.value == "queued" and finish.delay is not None:
            detail = f", next run in {finish.delay:.3g} s"
        if exc is not None:
            detail += f": {first_line(exc)}"
        key = f", key {job.limit_key}" if job.limit_key else ""
        logger.log(
            level, "job %d (%s, queue %s%s) attempt %d %s in %.1f ms%s",
            job.id, job.task, job.queue, key, job.attempt, kind.replace("_", " "),
            duration * 1000, detail,
            extra=self._extra(run, duration=duration, outcome=kind),
        )

    # -- cancellation ------------------------------------------------------------------

    def _on_cancel(self, job_id: int) -> None:
        run = self._running.get(job_id)
        if run is None or run.ctx.cancel_requested or run.recorded:
            return
        run.ctx.cancel_requested = True
        logger.info("job %d (%s): cancellation requested", job_id, run.job.task,
                    extra=self._extra(run))
        finish = outcomes.cancelled(run.job, self._wall_now(),
                                    "cancellation was requested while it ran")
        self._abandon(run, finish, "cancel")

    async def _cancel_poll_loop(self) -> None:
        while True:
            listening = self._listener is not None and self._listener.listening
            period = self.poll_interval * (10 if listening else 1)
            await self._wait(self._cancel_poll_now, period * self._random.uniform(0.8, 1.2))
            self._cancel_poll_now.clear()
            if not self._running:
                continue
            try:
                async with self.async_connection() as conn:
                    ids = await leases.cancel_requested(conn, self.worker_id)
            except Exception as exc:
                self._trouble.failed("cancellation poll", exc, period)
                continue
            self._trouble.recovered("cancellation poll")
            for job_id in ids:
                self._on_cancel(job_id)

    # -- outcomes ------------------------------------------------------------------------

    async def _write(self, batch: list[outcomes.Finish]) -> set[int]:
        async with self.async_connection() as conn:
            return await outcomes.write(
                conn, batch, hooks=self.app.on_transition_hooks, now=self.sql_now())

    def _report_written(self, batch: list[outcomes.Finish], accepted: set[int],
                        retried: bool) -> None:
        now = asyncio.get_running_loop().time()
        for finish in batch:
            if finish.job.id in accepted:
                if finish.delay is not None and finish.state.value == "queued":
                    self._due_at(finish.job.queue, now + finish.delay)
                continue
            if retried:
                # After a failed attempt the first write may have committed: the fence
                # then refuses the repeat, which is what we want.
                logger.debug("job %d: outcome already written or no longer ours",
                             finish.job.id)
                continue
            self.counts["lost"] += 1
            logger.warning(
                "job %d (%s): outcome %s discarded: the job is no longer this run's "
                "(rescued, cancelled or timed out meanwhile)", finish.job.id, finish.job.task,
                finish.kind, extra={"job_id": finish.job.id, "task": finish.job.task})

    async def _flush_loop(self) -> None:
        where = "writing outcomes"
        failures = 0
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            while self._pending:
                async with self._write_lock:
                    batch = self._pending[:MAX_BATCH]
                    try:
                        accepted = await self._write(batch) if batch else set()
                    except Exception as exc:
                        failures += 1
                        delay = backoff.reconnect_delay(failures, self._random.random())
                        self._trouble.failed(where, exc, delay)
                    else:
                        del self._pending[: len(batch)]
                        self._report_written(batch, accepted, failures > 0)
                        failures = 0
                        self._trouble.recovered(where)
                        delay = 0.0
                if delay:
                    await asyncio.sleep(delay)
            self._wake_blocked()
            self._settled.set()

    def _wake_blocked(self) -> None:
        for queue in self._queues.values():
            queue.freed.set()

    async def _flush_everything(self, *, raise_errors: bool) -> None:
        """Write every pending outcome now (drain and shutdown)."""
        while self._pending:
            async with self._write_lock:
                batch = self._pending[:MAX_BATCH]
                try:
                    accepted = await self._write(batch) if batch else set()
                except Exception:
                    if raise_errors:
                        raise
                    return
                del self._pending[: len(batch)]
                self._report_written(batch, accepted, False)

    # -- shutdown ------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        self._stopping = True
        self._wake_all()
        loop = asyncio.get_running_loop()
        if self._running and not self._force.is_set():
            deadline = loop.time() + self.shutdown_timeout
            logger.info("worker %s: waiting up to %g s for %d running job%s",
                        self.worker_id, self.shutdown_timeout, len(self._running),
                        "" if len(self._running) == 1 else "s")
            while self._running and not self._force.is_set():
                left = deadline - loop.time()
                if left <= 0:
                    break
                tasks = {run.aio for run in self._running.values() if run.aio is not None}
                force = asyncio.ensure_future(self._force.wait())
                await asyncio.wait({*tasks, force}, timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
                force.cancel()
        unfinished = [run for run in self._running.values() if not run.recorded]
        if unfinished:
            logger.warning("worker %s: giving back %d unfinished job%s: %s", self.worker_id,
                           len(unfinished), "" if len(unfinished) == 1 else "s",
                           ", ".join(str(run.job.id) for run in unfinished))
        for run in unfinished:
            self._abandon(run, outcomes.given_back(run.job), "give_back")
        cancelled = [run.aio for run in self._running.values()
                     if run.aio is not None and run.task.is_async]
        if cancelled:
            await asyncio.wait(cancelled, timeout=1.0)
        try:
            async with asyncio.timeout(2.0 if self._force.is_set() else FINAL_FLUSH_TIMEOUT):
                while self._pending:
                    await self._flush_everything(raise_errors=False)
                    if self._pending:
                        await asyncio.sleep(0.1)
                if self._registered.is_set():
                    async with self.async_connection() as conn:
                        await leases.unregister(conn, self.worker_id)
        except Exception as exc:
            if self._pending:
                logger.error(
                    "worker %s: could not write %d outcome%s before stopping (%s); those "
                    "jobs will be rescued when the lease expires", self.worker_id,
                    len(self._pending), "" if len(self._pending) == 1 else "s",
                    first_line(exc) if not isinstance(exc, TimeoutError) else "timed out")
            else:
                logger.warning("worker %s: could not unregister: %s", self.worker_id,
                               first_line(exc))


async def _quietly(future: asyncio.Future[Any]) -> None:
    with suppress(BaseException):
        await future
