"""The runner of tasks: one asyncio task per run, plain functions in a bounded
thread pool (one thread per slot).

It starts a claimed job, decides how the run ended (:func:`akadze.outcomes.decide`)
and hands the finish to ``submit`` (the outcome flusher); it ends runs early when
asked (cancellation, timeout, give-back on shutdown or fencing) and frees the slot
when a run is over. It changes ``state.running``, the slots' ``busy`` counts and
``state.counts``; it never touches the database except through the runs'
``complete_tx``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager, suppress
from datetime import datetime
from typing import Any

import psycopg
import pydantic

from .. import outcomes
from ..arguments import describe_validation
from ..errors import JobLost
from ..hooks import call_run_hooks
from ..jobs import ClaimedJob
from ._connections import Connections
from ._progress import ProgressWriter
from ._runs import RunContext, set_current
from ._state import Run, WorkerState
from ._trouble import first_line

logger = logging.getLogger("akadze.worker")

Submit = Callable[[outcomes.Finish], None]


class TaskRuntime:
    """What a run's ``current()`` reaches of the worker (the :class:`Runtime` of
    :mod:`._runs`): the clock, the connections, the transition hooks."""

    def __init__(self, state: WorkerState, connections: Connections,
                 progress: ProgressWriter) -> None:
        self._state = state
        self._connections = connections
        self._progress = progress

    def report_progress(self, job: ClaimedJob, fraction: float, message: str | None) -> None:
        self._progress.report(job, fraction, message)

    @property
    def transition_hooks(self) -> Sequence[Callable[..., Any]]:
        return self._state.settings.app.on_transition_hooks

    def sql_now(self) -> datetime | None:
        return self._state.settings.sql_now()

    @property
    def max_result_bytes(self) -> int:
        return self._state.settings.app.max_result_bytes

    @asynccontextmanager
    async def async_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._connections.connection() as conn:
            yield conn

    @contextmanager
    def sync_connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._connections.sync_connection() as conn:
            yield conn


class Runner:
    """Runs claimed jobs and reports how each run ended."""

    def __init__(self, state: WorkerState, runtime: TaskRuntime, *, submit: Submit) -> None:
        self._state = state
        self._settings = state.settings
        self._runtime = runtime
        self._submit = submit
        self._executor: ThreadPoolExecutor | None = None
        self._in_threads = 0
        self._threads_lock = threading.Lock()

    @property
    def threads_running(self) -> int:
        """Plain task functions running in threads right now (given-back ones too)."""
        return self._in_threads

    def _in_thread(self, call: Callable[[], object]) -> object:
        with self._threads_lock:
            self._in_threads += 1
        try:
            return call()
        finally:
            with self._threads_lock:
                self._in_threads -= 1

    def open(self) -> None:
        if self._settings.any_plain_task:
            self._executor = ThreadPoolExecutor(
                max_workers=self._settings.slots * len(self._settings.queues),
                thread_name_prefix="akadze-task",
            )

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # -- starting and ending runs -------------------------------------------------------

    def start(self, queue: str, job: ClaimedJob) -> None:
        """Run ``job`` (claimed for ``queue``) in a task of its own; takes a slot."""
        task = self._settings.app.tasks.get(job.task)
        if task is None:  # cannot happen: the claim filters on registered names
            self.hand_back(job)
            return
        ctx = RunContext(job, self._runtime)
        run = Run(job, task, ctx, queue, asyncio.get_running_loop().time())
        self._state.running[job.id] = run
        self._state.slots[queue].busy += 1
        run.aio = asyncio.create_task(self._execute(run))

    def hand_back(self, job: ClaimedJob) -> None:
        """Give back a job that was claimed but will not run here."""
        self._count_and_submit(outcomes.given_back(job))

    def cancel_unstarted(self, job: ClaimedJob) -> None:
        """End a job that was claimed but never started as cancelled (its
        cancellation was requested while it waited for a slot)."""
        self._count_and_submit(outcomes.cancelled(
            job, self._settings.wall_now(), "cancellation was requested before it started"))

    def tasks(self) -> list[asyncio.Task[None]]:
        """The asyncio tasks of the runs in progress."""
        return [run.aio for run in self._state.running.values() if run.aio is not None]

    def cancel(self, job_id: int) -> None:
        """Cancellation of ``job_id`` was requested: tell the run and end it as
        cancelled (ignored when the job does not run here, or is ending anyway)."""
        run = self._state.running.get(job_id)
        if run is None or run.ctx.cancel_requested or run.recorded:
            return
        run.ctx.cancel_requested = True
        logger.info("job %d (%s): cancellation requested", job_id, run.job.task,
                    extra=self._extra(run))
        finish = outcomes.cancelled(run.job, self._settings.wall_now(),
                                    "cancellation was requested while it ran")
        self._abandon(run, finish, "cancel")

    def give_back_unfinished(self) -> list[int]:
        """Give back every run whose outcome is not decided yet (shutdown, fencing);
        return their job ids."""
        unfinished = [run for run in self._state.running.values() if not run.recorded]
        reason = (f"worker {self._settings.worker_id} "
                  + ("could not renew its lease" if self._state.fenced else "was stopped"))
        at = self._settings.wall_now()
        for run in unfinished:
            self._abandon(run, outcomes.given_back(run.job, at, reason), "give_back")
        return [run.job.id for run in unfinished]

    def interrupted_tasks(self) -> list[asyncio.Task[None]]:
        """The asyncio tasks of async runs (those that an abandon interrupts)."""
        return [run.aio for run in self._state.running.values()
                if run.aio is not None and run.task.is_async]

    # -- one run -----------------------------------------------------------------------

    async def _execute(self, run: Run) -> None:
        job, task, ctx = run.job, run.task, run.ctx
        app = self._settings.app
        set_current(ctx)
        exc: BaseException | None = None
        result: object = None
        timed_out: float | None = None
        try:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("job %d (%s) attempt %d started", job.id, job.task, job.attempt,
                             extra=self._extra(run))
            try:
                if app.before_run_hooks:
                    await call_run_hooks(app.before_run_hooks, job)
                kwargs = _arguments(run)
                if isinstance(kwargs, str):
                    message = kwargs
                    run.body_done = True
                    self._finish(run, outcomes.invalid_args(
                        job, self._settings.wall_now(), message))
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
            if not run.recorded:
                self._ended(run, exc, result, timed_out)
        finally:
            run.body_done = True
            if app.after_run_hooks:
                try:
                    await call_run_hooks(app.after_run_hooks, job)
                except asyncio.CancelledError:
                    pass
                except Exception as hook_error:
                    logger.error("after_run hook failed for job %d: %s", job.id, hook_error,
                                 exc_info=hook_error, extra=self._extra(run))
            self._release(run)

    def _ended(self, run: Run, exc: BaseException | None, result: object,
               timed_out: float | None) -> None:
        """The task's function is over and nothing decided the run's outcome yet."""
        job, ctx = run.job, run.ctx
        if ctx.completed:  # complete_tx() wrote the success already
            ctx.outcome = outcomes.SUCCEEDED
            self._state.counts[outcomes.SUCCEEDED] += 1
            run.recorded = True
            self._log_finish(run, outcomes.SUCCEEDED, None)
            return
        if ctx.stop_reason == "lost":
            run.recorded = True
            self._state.counts["lost"] += 1
            logger.warning("job %d (%s): this run lost the job; its outcome is dropped",
                           job.id, job.task, extra=self._extra(run))
            return
        if ctx.cancel_requested:
            finish: outcomes.Finish = outcomes.cancelled(
                job, self._settings.wall_now(), "cancellation was requested while it ran")
        else:
            finish, warning = outcomes.decide(
                job, exc, result, at=self._settings.wall_now(),
                draw=self._state.random.random(), custom_backoff=run.task.backoff,
                timeout=timed_out, max_result_bytes=self._settings.app.max_result_bytes,
            )
            if warning:
                logger.warning("job %d: %s", job.id, warning, extra=self._extra(run))
        self._finish(run, finish, exc)

    async def _call_async(
        self, run: Run, kwargs: dict[str, Any]
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

    async def _run_in_thread(self, run: Run, kwargs: dict[str, Any]) -> object:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        future = loop.run_in_executor(
            self._executor, self._in_thread,
            functools.partial(context.run, functools.partial(run.task.fn, **kwargs)))
        try:
            if run.task.timeout is None:
                return await asyncio.shield(future)
            async with asyncio.timeout(run.task.timeout):  # not wait_for: see wait_for()
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done():
                raise
            # The thread cannot be interrupted: the run ends now (timeout), the slot
            # stays taken until the function returns, and what it returns is dropped.
            finish, _ = outcomes.decide(
                run.job, None, None, at=self._settings.wall_now(),
                draw=self._state.random.random(), custom_backoff=run.task.backoff,
                timeout=run.task.timeout,
            )
            self._abandon(run, finish, "timeout")
            await _quietly(future)
            return None

    def _abandon(self, run: Run, finish: outcomes.Finish, reason: str) -> None:
        """End a run before its function does: record ``finish`` now, tell the task
        (``current().should_stop``), and interrupt it when it is async."""
        if run.recorded:
            return
        run.ctx.stop_reason = run.ctx.stop_reason or reason
        self._finish(run, finish)
        if run.aio is not None and not run.body_done and run.task.is_async:
            run.aio.cancel()

    def _release(self, run: Run) -> None:
        state = self._state
        if state.running.get(run.job.id) is run:
            del state.running[run.job.id]
        slots = state.slots[run.queue]
        slots.busy -= 1
        slots.freed.set()
        state.settled.set()

    def _finish(
        self, run: Run, finish: outcomes.Finish, exc: BaseException | None = None
    ) -> None:
        if run.recorded:
            return
        run.recorded = True
        run.ctx.outcome = finish.kind
        self._count_and_submit(finish)
        self._log_finish(run, finish.kind, finish, exc)

    def _count_and_submit(self, finish: outcomes.Finish) -> None:
        self._state.counts[finish.kind] += 1
        self._submit(finish)

    # -- logging -----------------------------------------------------------------------

    def _extra(self, run: Run, **more: Any) -> dict[str, Any]:
        job = run.job
        return {"job_id": job.id, "task": job.task, "queue": job.queue, "key": job.limit_key,
                "attempt": job.attempt, "worker_id": self._settings.worker_id, **more}

    def _log_finish(
        self, run: Run, kind: str, finish: outcomes.Finish | None,
        exc: BaseException | None = None,
    ) -> None:
        level = logging.WARNING if kind in (outcomes.RETRIED, outcomes.FAILED) else logging.INFO
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


def _arguments(run: Run) -> dict[str, Any] | str:
    """The keyword arguments of the run's call, or why the stored ones cannot be used:
    unreadable (``ClaimedJob.unreadable``: only this job fails, never the claim that
    read it) or invalid for the task's model."""
    job = run.job
    if job.unreadable is not None:
        return f"task {job.task!r} cannot run: {job.unreadable}"
    try:
        return run.task.load_args(job.args)
    except pydantic.ValidationError as invalid:
        return "stored arguments are invalid: " + describe_validation(job.task, invalid)
    except RecursionError:
        return (f"stored arguments are invalid: task {job.task!r}: nested too deeply to "
                "validate (past Python's recursion limit)")


async def _quietly(future: asyncio.Future[Any]) -> None:
    with suppress(BaseException):
        await future
