"""The running job as a task sees it: ``akadze.current()`` and ``complete_tx()``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

import psycopg

from . import queries
from .errors import AkadzeError, JobLost
from .hooks import call_transition_hooks, call_transition_hooks_sync
from .jobs import ClaimedJob, JobState
from .outcomes import to_json

logger = logging.getLogger("akadze.worker")

_current: ContextVar[RunContext] = ContextVar("akadze_current_run")


class Runtime(Protocol):
    """What a run needs from the worker that started it."""

    @property
    def app(self) -> Any: ...

    def sql_now(self) -> datetime | None: ...

    def async_connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

    def sync_connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...


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
        text = to_json(result)  # a bad result fails here, before any write
        return CompleteTx(self, text)

    def __repr__(self) -> str:
        return f"<run of job {self.id} ({self.task!r}) attempt {self.attempt}>"


def _fence_failed(run: RunContext) -> JobLost:
    return JobLost(
        f"job {run.id} is no longer this run's (run_count {run.run_count}): it was "
        "cancelled, timed out or rescued; the transaction was rolled back"
    )


class CompleteTx:
    """The context manager returned by :meth:`RunContext.complete_tx` (async and sync)."""

    def __init__(self, run: RunContext, result: str | None) -> None:
        self._run = run
        self._result = result
        self._async_cm: AbstractAsyncContextManager[psycopg.AsyncConnection[Any]] | None = None
        self._sync_cm: AbstractContextManager[psycopg.Connection[Any]] | None = None

    def _params(self) -> dict[str, Any]:
        return {
            "id": self._run.id,
            "run_count": self._run.run_count,
            "result": self._result,
            "now": self._run._runtime.sql_now(),
        }

    def _check_usable(self) -> None:
        if self._run.completed:
            raise AkadzeError(f"job {self._run.id} was already completed by complete_tx()")

    # -- async ---------------------------------------------------------------------

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._check_usable()
        self._async_cm = asynccontextmanager(self._async_body)()
        return await self._async_cm.__aenter__()

    async def _async_body(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        runtime = self._run._runtime
        async with runtime.async_connection() as conn, conn.transaction():
            yield conn
            cur = await conn.execute(queries.get("finish_one"), self._params())
            if await cur.fetchone() is None:
                raise _fence_failed(self._run)
            await call_transition_hooks(
                runtime.app.on_transition_hooks, conn, self._run.job,
                JobState.RUNNING.value, JobState.SUCCEEDED.value,
            )

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._async_cm is not None
        suppressed = await self._async_cm.__aexit__(kind, exc, tb)
        if exc is None:
            self._run.completed = True
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
            cur = conn.execute(queries.get("finish_one"), self._params())
            if cur.fetchone() is None:
                raise _fence_failed(self._run)
            call_transition_hooks_sync(
                runtime.app.on_transition_hooks, conn, self._run.job,
                JobState.RUNNING.value, JobState.SUCCEEDED.value,
            )

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._sync_cm is not None
        suppressed = self._sync_cm.__exit__(kind, exc, tb)
        if exc is None:
            self._run.completed = True
        return suppressed
