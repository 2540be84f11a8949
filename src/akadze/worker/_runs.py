"""The running job as a task sees it: ``akadze.current()`` and ``complete_tx()``.

``complete_tx()`` works in async tasks (``async with``) and plain ones (``with``):
both run the same steps (:func:`_commit_steps`, a generator of what to do), each
through a driver of a few lines that does the I/O its way.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

import psycopg
from psycopg import sql

from .. import queries
from ..errors import AkadzeError, JobLost
from ..hooks import call_transition_hooks, call_transition_hooks_sync
from ..jobs import ClaimedJob, JobState
from ..outcomes import to_json

logger = logging.getLogger("akadze.worker")

_current: ContextVar[RunContext] = ContextVar("akadze_current_run")

PROGRESS_MESSAGE_MAX = 1000


class Runtime(Protocol):
    """What a run needs from the worker that started it."""

    @property
    def transition_hooks(self) -> Sequence[Callable[..., Any]]: ...

    def sql_now(self) -> datetime | None: ...

    @property
    def max_result_bytes(self) -> int: ...

    def async_connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

    def sync_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def report_progress(self, job: ClaimedJob, fraction: float, message: str | None
                        ) -> None: ...


def current() -> RunContext:
    """The job the calling task is running.

    Raises AkadzeError outside a task run by an akadze worker.
    """
    try:
        return _current.get()
    except LookupError:
        raise AkadzeError(
            "akadze.current() is only available inside a task run by an akadze worker"
        ) from None


def set_current(run: RunContext) -> None:
    """Make ``run`` what :func:`current` returns in the calling task (and in the
    threads it hands its context to)."""
    _current.set(run)


class RunContext:
    """One run of one job, as the task sees it (``akadze.current()``).

    Attributes: ``job`` (the :class:`~akadze.ClaimedJob`), ``id``, ``task``,
    ``queue``, ``attempt`` (1 on the first run), ``max_attempts``, ``run_count``
    (the fencing token), ``meta``, ``limit_key``, ``worker_id``.

    ``cancel_requested`` turns true when someone asked to cancel the job while it
    runs; ``should_stop`` also turns true when the run was given up for another
    reason (timeout, shutdown give-back, lost lease). A plain (thread) task should
    check them at convenient points; an async task is interrupted instead.
    """

    __slots__ = (
        "_runtime",
        "cancel_requested",
        "completed",
        "job",
        "outcome",
        "stop_reason",
    )

    def __init__(self, job: ClaimedJob, runtime: Runtime) -> None:
        self.job = job
        self._runtime = runtime
        self.cancel_requested = False
        #: Why the run was given up (``"cancel"``, ``"timeout"``, ``"give_back"``), if it was.
        self.stop_reason: str | None = None
        #: True once complete_tx() committed the move to succeeded.
        self.completed = False
        #: How the run ended (``"succeeded"``, ``"retried"`` ...), set before after_run hooks.
        self.outcome: str | None = None

    id = property(lambda self: self.job.id)
    task = property(lambda self: self.job.task)
    queue = property(lambda self: self.job.queue)
    attempt = property(lambda self: self.job.attempt)
    max_attempts = property(lambda self: self.job.max_attempts)
    run_count = property(lambda self: self.job.run_count)
    meta = property(lambda self: self.job.meta)
    limit_key = property(lambda self: self.job.limit_key)
    worker_id = property(lambda self: self.job.worker_id)

    @property
    def should_stop(self) -> bool:
        return self.cancel_requested or self.stop_reason is not None

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the run is: ``fraction`` from 0.0 to 1.0, and an optional
        ``message`` (at most 1 000 characters). Cheap to call often: the worker writes
        the latest report of each job at most once a second, where ``get_job``,
        ``akadze jobs show``, the dashboard and the metrics read it."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not (
                math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
            raise AkadzeError(f"progress takes a fraction from 0.0 to 1.0, got {fraction!r}")
        if message is not None and (not isinstance(message, str) or "\x00" in message
                                    or len(message) > PROGRESS_MESSAGE_MAX):
            raise AkadzeError(
                f"a progress message is a str of at most {PROGRESS_MESSAGE_MAX} characters "
                "without NUL")
        self._runtime.report_progress(self.job, float(fraction), message)

    def parent_results(self) -> dict[int, Any]:
        """The results of this job's parents (``after=``), by parent id: a parent that
        did not succeed (a child with ``after_policy="run"``) maps to None. For plain
        (thread) tasks; an async task awaits :meth:`parent_results_async`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise AkadzeError("parent_results() would block the event loop of an async "
                              "task: await current().parent_results_async() instead")
        with self._runtime.sync_connection() as conn:
            rows = conn.execute(queries.get("job_parent_results"), {"id": self.id}).fetchall()
        return _results(rows)

    async def parent_results_async(self) -> dict[int, Any]:
        """The async twin of :meth:`parent_results`."""
        async with self._runtime.async_connection() as conn:
            cur = await conn.execute(queries.get("job_parent_results"), {"id": self.id})
            return _results(await cur.fetchall())

    def complete_tx(self, result: object = None) -> CompleteTx:
        """A transaction that commits the task's own writes together with the move of
        this job to ``succeeded`` (``result`` stored as its result).

        ``async with current().complete_tx() as conn:`` in an async task (``conn`` is
        a psycopg AsyncConnection), ``with current().complete_tx() as conn:`` in a
        plain one. Enqueue follow-up jobs with ``task.using(session=conn)``. The move
        is fenced by ``run_count``: when the job was lost meanwhile (rescued after a
        lost lease, cancelled, timed out), everything in the block is rolled back and
        :class:`~akadze.errors.JobLost` is raised.
        """
        # A bad result fails here, before any write.
        text = to_json(result, self._runtime.max_result_bytes)
        return CompleteTx(self, text)

    def __repr__(self) -> str:
        return f"<run of job {self.id} ({self.task!r}) attempt {self.attempt}>"


def _results(rows: Sequence[Any]) -> dict[int, Any]:
    return {int(parent): (result if state == "succeeded" else None)
            for parent, state, result in rows}


def _fence_failed(run: RunContext) -> JobLost:
    return JobLost(
        f"job {run.id} is no longer this run's (run_count {run.run_count}): it was "
        "cancelled, timed out or rescued; the transaction was rolled back"
    )


@dataclass(frozen=True, slots=True)
class _Fetch:
    """Run a statement; the reply is its first row (or None)."""

    query: sql.SQL
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Transition:
    """Call the on_transition hooks for ``job`` going ``old`` -> ``new``; no reply."""

    job: ClaimedJob
    old: str
    new: str


_Step = _Fetch | _Transition


def _commit_steps(run: RunContext, result: str | None) -> Generator[_Step, Any, None]:
    """What complete_tx does after the task's block, inside its transaction: the
    fenced move to succeeded, then the transition hooks. Raises JobLost (so that
    the transaction rolls back) when the fence fails."""
    row = yield _Fetch(queries.get("finish_one"), {
        "id": run.id, "run_count": run.run_count, "result": result,
        "now": run._runtime.sql_now(),
    })
    if row is None:
        raise _fence_failed(run)
    yield _Transition(run.job, JobState.RUNNING.value, JobState.SUCCEEDED.value)


async def _drive_async(
    conn: psycopg.AsyncConnection[Any], steps: Generator[_Step, Any, None],
    hooks: Sequence[Callable[..., Any]],
) -> None:
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration:
            return
        if isinstance(step, _Fetch):
            cur = await conn.execute(step.query, step.params)
            reply = await cur.fetchone()
        else:
            await call_transition_hooks(hooks, conn, step.job, step.old, step.new)
            reply = None


def _drive_sync(
    conn: psycopg.Connection[Any], steps: Generator[_Step, Any, None],
    hooks: Sequence[Callable[..., Any]],
) -> None:
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration:
            return
        if isinstance(step, _Fetch):
            reply = conn.execute(step.query, step.params).fetchone()
        else:
            call_transition_hooks_sync(hooks, conn, step.job, step.old, step.new)
            reply = None


class CompleteTx:
    """The context manager returned by :meth:`RunContext.complete_tx` (async and sync)."""

    def __init__(self, run: RunContext, result: str | None) -> None:
        self._run = run
        self._result = result
        self._async_cm: AbstractAsyncContextManager[psycopg.AsyncConnection[Any]] | None = None
        self._sync_cm: AbstractContextManager[psycopg.Connection[Any]] | None = None

    def _check_usable(self) -> None:
        if self._run.completed:
            raise AkadzeError(f"job {self._run.id} was already completed by complete_tx()")

    def _ended(self, exc: BaseException | None) -> None:
        if exc is None:
            self._run.completed = True

    # -- async ---------------------------------------------------------------------

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._check_usable()
        self._async_cm = asynccontextmanager(self._async_body)()
        return await self._async_cm.__aenter__()

    async def _async_body(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        runtime = self._run._runtime
        async with runtime.async_connection() as conn, conn.transaction():
            yield conn
            await _drive_async(conn, _commit_steps(self._run, self._result),
                               runtime.transition_hooks)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._async_cm is not None
        suppressed = await self._async_cm.__aexit__(kind, exc, tb)
        self._ended(exc)
        return suppressed

    # -- sync ----------------------------------------------------------------------

    def __enter__(self) -> psycopg.Connection[Any]:
        self._check_usable()
        self._sync_cm = contextmanager(self._sync_body)()
        return self._sync_cm.__enter__()

    def _sync_body(self) -> Iterator[psycopg.Connection[Any]]:
        runtime = self._run._runtime
        with runtime.sync_connection() as conn, conn.transaction():
            yield conn
            _drive_sync(conn, _commit_steps(self._run, self._result), runtime.transition_hooks)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._sync_cm is not None
        suppressed = self._sync_cm.__exit__(kind, exc, tb)
        self._ended(exc)
        return suppressed
