"""Operator actions: pause and resume queues, requeue failed jobs, retry a waiting job now.

Each function joins the caller's transaction like an enqueue does (``session``: a psycopg
connection or a SQLAlchemy connection/session), or runs a transaction of its own when
given a source (the app, an engine, a pool, a URL). The async functions have ``_sync``
twins for sync sessions.

- ``pause_queue``: no worker claims from the queue any more (cluster-wide, through
  ``akadze.queue_pauses``); jobs already running finish normally.
- ``requeue``: a ``failed`` or ``cancelled`` job becomes ``queued`` again, ready now,
  with a fresh set of attempts (``attempt`` back to 0, ``max_attempts`` unchanged).
  Its errors are kept: they are the job's history. A job whose ``unique_key`` is
  held by another active job is refused with DuplicateJob.
- ``retry_now``: a queued job waiting for its ``run_at`` (a retry backoff or a delay)
  becomes ready now. Workers see it at their next poll.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from . import queries, sessions
from .errors import ConfigurationError, DuplicateJob, InvalidJobState, JobNotFound
from .hooks import call_transition_hooks, call_transition_hooks_sync, transition_hooks
from .jobs import ClaimedJob, JobState, check_job_id, job_rows, job_state_rows

if TYPE_CHECKING:
    from .app import Akadze

__all__ = [
    "pause_queue",
    "pause_queue_sync",
    "requeue",
    "requeue_sync",
    "resume_queue",
    "resume_queue_sync",
    "retry_now",
    "retry_now_sync",
]

REQUEUABLE = ("failed", "cancelled")


def _check_queue(queue: object) -> str:
    if not isinstance(queue, str) or not queue or "\x00" in queue:
        raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
    return queue




def _check_requeue(row: tuple[ClaimedJob, JobState] | None, job_id: int) -> tuple[str, str]:
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    job, state = row[0], row[1].value
    if state not in REQUEUABLE:
        raise InvalidJobState(
            f"job {job_id} is {state}; only failed or cancelled jobs can be requeued"
        )
    return state, str(job.unique_key)


def _check_retry(row: tuple[ClaimedJob, JobState] | None, job_id: int) -> None:
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    state = row[1].value
    if state != "queued":
        raise InvalidJobState(
            f"job {job_id} is {state}; retry_now applies to queued jobs "
            "(use requeue for failed or cancelled ones)"
        )


# -- async ------------------------------------------------------------------------------


async def pause_queue(session: Any, queue: str) -> bool:
    """Pause ``queue`` for every worker; False if it was paused already."""
    queue = _check_queue(queue)
    async with sessions.writing(session) as conn:
        cur = await conn.execute(queries.get("queue_pause"), {"queue": queue, "now": None})
        return await cur.fetchone() is not None


async def resume_queue(session: Any, queue: str) -> bool:
    """Resume ``queue``; False if it was not paused."""
    queue = _check_queue(queue)
    async with sessions.writing(session) as conn:
        cur = await conn.execute(queries.get("queue_resume"), {"queue": queue})
        return await cur.fetchone() is not None


async def requeue(session: Any, job_id: int, *, app: Akadze | None = None) -> None:
    """Move a failed or cancelled job back to ``queued`` (see the module docs). Raises
    JobNotFound, InvalidJobState (any other state) or DuplicateJob. ``app``: whose
    on_transition hooks run (default: ``session`` when it is the app)."""
    job_id = check_job_id(job_id)
    hooks = transition_hooks(session, app)
    async with sessions.writing(session) as conn:
        locked = await conn.cursor(row_factory=job_state_rows).execute(
            queries.get("job_lock"), {"id": job_id})
        before, unique_key = _check_requeue(await locked.fetchone(), job_id)
        try:
            async with conn.transaction():  # a savepoint: the caller's transaction survives
                cur = await conn.cursor(row_factory=job_rows).execute(
                    queries.get("job_requeue"), {"id": job_id, "now": None})
                job = await cur.fetchone()
        except psycopg.errors.UniqueViolation:
            raise DuplicateJob(unique_key) from None
        assert job is not None
        await call_transition_hooks(hooks, conn, job, before, "queued")


async def retry_now(session: Any, job_id: int) -> bool:
    """Make a queued job waiting for its run_at ready now; False if it was ready
    already. Raises JobNotFound, or InvalidJobState when the job is not queued."""
    job_id = check_job_id(job_id)
    async with sessions.writing(session) as conn:
        locked = await conn.cursor(row_factory=job_state_rows).execute(
            queries.get("job_lock"), {"id": job_id})
        _check_retry(await locked.fetchone(), job_id)
        cur = await conn.execute(queries.get("job_retry_now"), {"id": job_id, "now": None})
        return await cur.fetchone() is not None


# -- sync -------------------------------------------------------------------------------


def pause_queue_sync(session: Any, queue: str) -> bool:
    """The sync twin of :func:`pause_queue`."""
    queue = _check_queue(queue)
    with sessions.writing_sync(session) as conn:
        return conn.execute(
            queries.get("queue_pause"), {"queue": queue, "now": None}
        ).fetchone() is not None


def resume_queue_sync(session: Any, queue: str) -> bool:
    """The sync twin of :func:`resume_queue`."""
    queue = _check_queue(queue)
    with sessions.writing_sync(session) as conn:
        return conn.execute(queries.get("queue_resume"), {"queue": queue}).fetchone() is not None


def requeue_sync(session: Any, job_id: int, *, app: Akadze | None = None) -> None:
    """The sync twin of :func:`requeue`."""
    job_id = check_job_id(job_id)
    hooks = transition_hooks(session, app)
    with sessions.writing_sync(session) as conn:
        before, unique_key = _check_requeue(conn.cursor(row_factory=job_state_rows).execute(
            queries.get("job_lock"), {"id": job_id}).fetchone(), job_id)
        try:
            with conn.transaction():
                job = conn.cursor(row_factory=job_rows).execute(
                    queries.get("job_requeue"), {"id": job_id, "now": None}
                ).fetchone()
        except psycopg.errors.UniqueViolation:
            raise DuplicateJob(unique_key) from None
        assert job is not None
        call_transition_hooks_sync(hooks, conn, job, before, "queued")


def retry_now_sync(session: Any, job_id: int) -> bool:
    """The sync twin of :func:`retry_now`."""
    job_id = check_job_id(job_id)
    with sessions.writing_sync(session) as conn:
        _check_retry(conn.cursor(row_factory=job_state_rows).execute(
            queries.get("job_lock"), {"id": job_id}).fetchone(), job_id)
        return conn.execute(
            queries.get("job_retry_now"), {"id": job_id, "now": None}
        ).fetchone() is not None
