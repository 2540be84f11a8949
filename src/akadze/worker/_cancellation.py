"""Noticing that someone asked to cancel a job running here.

``request_cancel`` marks the row and sends ``NOTIFY akadze_cancel, '<job id>'``;
the listener hands the notification to :meth:`CancelWatcher.requested`.

A notification is only a hint: PostgreSQL lets any role ``NOTIFY`` on any channel,
with any payload, whether or not it may read the schema. So the watcher never acts
on a notification's id: when the id is one of the jobs held here, it reads which
of this worker's running jobs the database marks ``cancel_requested`` (at once),
and cancels those. Ids of jobs not running here cost nothing.

Since a notification can be missed (no LISTEN, or sent while the listener
reconnected), the watcher also polls for the mark: every ``poll_interval`` without
LISTEN, ten times less often with it, and once at once whenever the listener
(re)connects. What to do with a cancelled run is the runner's business (``cancel``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg

from .. import queries
from ._connections import Connections
from ._state import WorkerState, wait_for


async def cancel_requested(conn: psycopg.AsyncConnection[Any], worker_id: str) -> list[int]:
    """Ids of this worker's running jobs whose cancellation was requested."""
    cur = await conn.execute(queries.get("worker_cancel_requested"), {"worker_id": worker_id})
    return [int(str(row[0])) for row in await cur.fetchall()]


class CancelWatcher:
    """Turns cancellation requests into calls of ``cancel(job_id)``."""

    def __init__(self, state: WorkerState, connections: Connections, *,
                 cancel: Callable[[int], None], listening: Callable[[], bool],
                 holds: Callable[[int], bool]) -> None:
        self._state = state
        self._connections = connections
        self._cancel = cancel
        self._listening = listening
        self._holds = holds
        self._poll_now = asyncio.Event()

    def requested(self, job_id: int) -> None:
        """A cancel notification for ``job_id`` (maybe not a job of this worker, maybe
        sent by anyone): when the job is here (running, or claimed ahead), ask the
        database at once."""
        if self._holds(job_id):
            self._poll_now.set()

    def poll_soon(self) -> None:
        """Look for missed requests at once (the listener has just (re)connected)."""
        self._poll_now.set()

    async def run(self) -> None:
        state = self._state
        while True:
            period = state.settings.poll_interval * (10 if self._listening() else 1)
            await wait_for(self._poll_now, period * state.random.uniform(0.8, 1.2))
            asked = self._poll_now.is_set()  # a notification, or a (re)connected listener
            self._poll_now.clear()
            if not state.running and not asked:
                continue
            try:
                async with self._connections.connection() as conn:
                    ids = await cancel_requested(conn, state.settings.worker_id)
            except Exception as exc:
                state.trouble.failed("cancellation poll", exc, period)
                continue
            state.trouble.recovered("cancellation poll")
            for job_id in ids:
                self._cancel(job_id)
            state.events.emit("cancel_checked", job_ids=ids)
