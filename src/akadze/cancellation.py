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

from typing import TYPE_CHECKING, Any

from . import queries, sessions
from .errors import JobNotFound
from .hooks import call_transition_hooks, call_transition_hooks_sync, transition_hooks
from .jobs import ClaimedJob, JobState, check_job_id, job_state_rows

if TYPE_CHECKING:
    from .app import Akadze

__all__ = ["request_cancel", "request_cancel_sync"]




def _found(row: tuple[ClaimedJob, JobState] | None, job_id: int) -> tuple[ClaimedJob, str]:
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    job, state = row
    return job, state.value


async def request_cancel(session: Any, job_id: int, *, app: Akadze | None = None) -> bool:
    """Cancel job ``job_id``: True when it was queued (now cancelled) or running (its
    worker is told); False when it had finished already. Raises JobNotFound.

    ``session``: an async session (joined: the cancel commits with the caller) or a
    source (app, URL, engine, pool: a transaction of its own). ``app``: whose
    on_transition hooks to run (default: ``session`` when it is the app).
    """
    job_id = check_job_id(job_id)
    hooks = transition_hooks(session, app)
    async with sessions.writing(session) as conn:
        cur = await conn.cursor(row_factory=job_state_rows).execute(
            queries.get("job_for_cancel"), {"id": job_id})
        job, state = _found(await cur.fetchone(), job_id)
        if state == "queued":
            await conn.execute(queries.get("cancel_queued"), {"id": job_id, "now": None})
            await call_transition_hooks(hooks, conn, job, "queued", "cancelled")
            return True
        if state == "running":
            await conn.execute(queries.get("cancel_running"), {"id": job_id})
            return True
        return False


def request_cancel_sync(session: Any, job_id: int, *, app: Akadze | None = None) -> bool:
    """The sync twin of :func:`request_cancel`, for sync sessions."""
    job_id = check_job_id(job_id)
    hooks = transition_hooks(session, app)
    with sessions.writing_sync(session) as conn:
        cur = conn.cursor(row_factory=job_state_rows).execute(
            queries.get("job_for_cancel"), {"id": job_id})
        job, state = _found(cur.fetchone(), job_id)
        if state == "queued":
            conn.execute(queries.get("cancel_queued"), {"id": job_id, "now": None})
            call_transition_hooks_sync(hooks, conn, job, "queued", "cancelled")
            return True
        if state == "running":
            conn.execute(queries.get("cancel_running"), {"id": job_id})
            return True
        return False
