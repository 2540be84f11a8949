"""Helpers for the tests of applications that use akadze.

- ``await drain(app)`` runs every ready job to completion in this process (with the
  real worker code: claim, outcomes, hooks, retries) and returns how the runs ended.
- ``await assert_enqueued(app, "task", **args)`` checks that a job of that task with
  those arguments exists (``assert_enqueued_sync`` for sync tests).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

import pydantic_core

from . import dialog, queries
from .app import Akadze
from .dialog import Dialog
from .sessions import Session, SyncSession
from .worker import Worker

__all__ = ["assert_enqueued", "assert_enqueued_sync", "drain"]


async def drain(
    app: Akadze,
    *,
    queues: Sequence[str] | None = None,
    slots: int = 10,
    max_runs: int = 10_000,
    database_url: str | None = None,
) -> dict[str, int]:
    """Run every ready job of the app's tasks until none is left; return the number
    of runs by how they ended: ``succeeded``, ``retried``, ``snoozed``, ``failed``,
    ``cancelled``, ``given_back``.

    Jobs that become ready while draining (follow-up jobs, retries without delay)
    run too, up to ``max_runs`` runs. Jobs due later (a retry's backoff, a delay)
    are left queued. ``queues``: default, the queues of the app's tasks and every
    queue holding ready jobs of them.
    """
    url = database_url or app.database_url
    if queues is None:
        names = sorted(app.tasks)
        rows = await dialog.read(url, dialog.rows(queries.get("testing_ready_queues"),
                                                  {"tasks": names}))
        found = {str(row[0]) for row in rows}
        queues = sorted(found | {task.queue for task in app.tasks.values()})
    worker = Worker(
        app, queues=queues, slots=slots, listen=False, maintenance=False,
        database_url=url, worker_id=f"drain:{os.getpid()}:{uuid.uuid4().hex[:8]}",
    )
    return await worker.drain(max_runs=max_runs)


def _assert_enqueued(app: object, task: str, args: dict[str, Any]) -> Dialog[list[int]]:
    """The check of assert_enqueued, written once (akadze.dialog)."""
    if isinstance(app, Akadze):
        app.get_task(task)  # UnknownTask for a typo
    wanted = pydantic_core.to_jsonable_python(args)
    rows = yield from dialog.rows(queries.get("testing_jobs_of_task"), {"task": task})
    matching = [int(row[0]) for row in rows if _contains(row[3], wanted)]
    if matching:
        return matching
    seen = "; ".join(f"job {row[0]} ({row[2]}) args={row[3]}" for row in rows[:10]) or "none"
    raise AssertionError(
        f"no job of task {task!r} with arguments {wanted} was enqueued; "
        f"jobs of that task: {seen}"
    )


def _contains(stored: Any, wanted: Any) -> bool:
    """JSON containment, like PostgreSQL's ``@>`` on objects."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(
            key in stored and _contains(stored[key], value) for key, value in wanted.items()
        )
    return bool(stored == wanted)


async def assert_enqueued(app: Session, task: str, /, **args: Any) -> list[int]:
    """Assert that at least one job of ``task`` whose arguments include ``args`` exists
    (in any state); return the ids of the matching jobs. ``app``: the Akadze app, or
    any session or source that :mod:`akadze.sessions` accepts."""
    return await dialog.read(app, _assert_enqueued(app, task, args))


def assert_enqueued_sync(app: SyncSession, task: str, /, **args: Any) -> list[int]:
    """The sync twin of :func:`assert_enqueued`."""
    return dialog.read_sync(app, _assert_enqueued(app, task, args))
