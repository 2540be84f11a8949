"""Operator actions: pause and resume queues, requeue failed jobs, retry a waiting job now.

Each function joins the caller's transaction like an enqueue does (``session``: a psycopg
connection or a SQLAlchemy connection/session), or runs a transaction of its own when
given a source (the app, an engine, a pool, a URL). The async functions have ``_sync``
twins for sync sessions; each pair is two thin calls of one dialog (akadze.dialog).

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

from . import dialog, names, queries
from .app import Akadze, transition_hooks
from .dialog import Dialog
from .enqueue import lock_keys, read_holders
from .errors import ConfigurationError, DuplicateJob, InvalidJobState, JobNotFound
from .hooks import Hook
from .jobs import ClaimedJob, JobState, check_job_id, job_rows, job_state_rows
from .sessions import Session, SyncSession

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
    """A queue's name as enqueue accepts it (akadze.names); ConfigurationError naming
    ``queue`` otherwise, before any statement."""
    wrong = names.problem(queue, "queue")
    if wrong is not None:
        raise ConfigurationError(wrong)
    assert isinstance(queue, str)
    return queue


def _check_requeue(row: tuple[ClaimedJob, JobState] | None, job_id: int
                   ) -> tuple[str, str | None]:
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    job, state = row[0], row[1].value
    if state not in REQUEUABLE:
        raise InvalidJobState(
            f"job {job_id} is {state}; only failed or cancelled jobs can be requeued"
        )
    return state, job.unique_key


def _check_retry(row: tuple[ClaimedJob, JobState] | None, job_id: int) -> None:
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    state = row[1].value
    if state != "queued":
        raise InvalidJobState(
            f"job {job_id} is {state}; retry_now applies to queued jobs "
            "(use requeue for failed or cancelled ones)"
        )


# -- the operations, written once (akadze.dialog) ---------------------------------------


def _pause(queue: object) -> Dialog[bool]:
    checked = _check_queue(queue)
    return (yield from dialog.one(queries.get("queue_pause"), {"queue": checked, "now": None})
            ) is not None


def _resume(queue: object) -> Dialog[bool]:
    checked = _check_queue(queue)
    return (yield from dialog.one(queries.get("queue_resume"), {"queue": checked})) is not None


def _requeue(job_id: object, hooks: list[Hook]) -> Dialog[None]:
    checked = check_job_id(job_id)
    found = yield from dialog.one(queries.get("job_lock"), {"id": checked},
                                 row_factory=job_state_rows)
    before, unique_key = _check_requeue(found, checked)
    if unique_key is not None:  # held by another job not finished: refused (akadze.uniqueness)
        yield from lock_keys([unique_key])
        holders, _ = yield from read_holders([unique_key], [None])
        others = [h.id for h in holders.get(unique_key, ()) if h.id != checked]
        if others:
            raise DuplicateJob(unique_key, max(others))
    row = yield from dialog.one(queries.get("job_requeue"), {"id": checked, "now": None},
                               row_factory=job_rows)
    assert row is not None
    yield from dialog.call_hooks(hooks, row, before, "queued",
                                 kind="on_transition", where="requeue_sync")


def _retry_now(job_id: object) -> Dialog[bool]:
    checked = check_job_id(job_id)
    _check_retry((yield from dialog.one(queries.get("job_lock"), {"id": checked},
                                        row_factory=job_state_rows)), checked)
    moved = yield from dialog.one(queries.get("job_retry_now"), {"id": checked, "now": None})
    return moved is not None


# -- async, and the sync twins ----------------------------------------------------------


async def pause_queue(session: Session, queue: str) -> bool:
    """Pause ``queue`` for every worker; False if it was paused already."""
    return await dialog.write(session, _pause(queue))


def pause_queue_sync(session: SyncSession, queue: str) -> bool:
    """The sync twin of :func:`pause_queue`."""
    return dialog.write_sync(session, _pause(queue))


async def resume_queue(session: Session, queue: str) -> bool:
    """Resume ``queue``; False if it was not paused."""
    return await dialog.write(session, _resume(queue))


def resume_queue_sync(session: SyncSession, queue: str) -> bool:
    """The sync twin of :func:`resume_queue`."""
    return dialog.write_sync(session, _resume(queue))


async def requeue(session: Session, job_id: int, *, app: Akadze | None = None) -> None:
    """Move a failed or cancelled job back to ``queued`` (see the module docs). Raises
    JobNotFound, InvalidJobState (any other state) or DuplicateJob. ``app``: whose
    on_transition hooks run (default: ``session`` when it is the app)."""
    await dialog.write(session, _requeue(job_id, transition_hooks(session, app)))


def requeue_sync(session: SyncSession, job_id: int, *, app: Akadze | None = None) -> None:
    """The sync twin of :func:`requeue`."""
    dialog.write_sync(session, _requeue(job_id, transition_hooks(session, app)))


async def retry_now(session: Session, job_id: int) -> bool:
    """Make a queued job waiting for its run_at ready now; False if it was ready
    already. Raises JobNotFound, or InvalidJobState when the job is not queued."""
    return await dialog.write(session, _retry_now(job_id))


def retry_now_sync(session: SyncSession, job_id: int) -> bool:
    """The sync twin of :func:`retry_now`."""
    return dialog.write_sync(session, _retry_now(job_id))
