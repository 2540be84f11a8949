"""Cancelling jobs: ``request_cancel(session, job_id)``.

- A queued job is moved to ``cancelled`` at once: it never runs.
- A running job is flagged (``cancel_requested``) and its worker is told with
  ``NOTIFY akadze_cancel`` at commit (and finds the flag by polling without
  LISTEN). An async task is interrupted (its asyncio task is cancelled); a plain
  task sees ``current().cancel_requested`` turn true and what it returns is
  dropped. Either way the job ends ``cancelled``.
- A finished job is left alone: the call returns False.

The request joins the caller's transaction like an enqueue does: it takes effect
when the caller commits.
"""

from __future__ import annotations

from . import dialog, queries
from .app import Akadze, transition_hooks
from .dialog import Dialog
from .errors import JobNotFound
from .hooks import Hook
from .jobs import ClaimedJob, JobState, check_job_id, job_state_rows
from .sessions import Session, SyncSession

__all__ = ["request_cancel", "request_cancel_sync"]


def _found(row: tuple[ClaimedJob, JobState] | None, job_id: int) -> tuple[ClaimedJob, str]:
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    job, state = row
    return job, state.value


def _cancel(job_id: object, hooks: list[Hook]) -> Dialog[bool]:
    checked = check_job_id(job_id)
    job, state = _found((yield from dialog.one(queries.get("job_for_cancel"), {"id": checked},
                                            row_factory=job_state_rows)),
                        checked)
    if state in ("queued", "waiting", "reserved"):  # a waiting job's children are cancelled in turn
        yield from dialog.execute(queries.get("cancel_queued"), {"id": checked, "now": None})
        yield from dialog.call_hooks(hooks, job, state, "cancelled", kind="on_transition",
                                     where="request_cancel_sync")
        return True
    if state == "running":
        yield from dialog.execute(queries.get("cancel_running"), {"id": checked})
        return True
    return False


async def request_cancel(session: Session, job_id: int, *, app: Akadze | None = None) -> bool:
    """Cancel job ``job_id``: True when it was queued (now cancelled) or running (its
    worker is told); False when it had finished already. Raises JobNotFound.

    ``session``: an async session (joined: the cancel commits with the caller) or a
    source (app, URL, engine, pool: a transaction of its own). ``app``: whose
    on_transition hooks to run (default: ``session`` when it is the app).
    """
    return await dialog.write(session, _cancel(job_id, transition_hooks(session, app)))


def request_cancel_sync(
    session: SyncSession, job_id: int, *, app: Akadze | None = None
) -> bool:
    """The sync twin of :func:`request_cancel`, for sync sessions (one dialog for both)."""
    return dialog.write_sync(session, _cancel(job_id, transition_hooks(session, app)))
