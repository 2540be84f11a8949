"""Progress: what running tasks report with ``current().progress(fraction, message)``,
written at most once a second per job.

A report only records the latest value of its job (any thread may report); the write
loop sends every job's latest value in one fenced statement once a second, when
there is something to send. A job that reports a thousand times a second costs one
row update a second; one that never reports costs nothing.
"""

from __future__ import annotations

import asyncio
import threading

from .. import queries
from ..jobs import ClaimedJob
from ._connections import Connections
from ._state import WorkerState

#: The most one job's progress is written: once per this many seconds.
INTERVAL = 1.0


class ProgressWriter:
    """The latest report of each running job, and the loop that writes them."""

    def __init__(self, state: WorkerState, connections: Connections) -> None:
        self._state = state
        self._connections = connections
        self._lock = threading.Lock()
        self._latest: dict[int, tuple[int, float, str | None]] = {}

    def report(self, job: ClaimedJob, fraction: float, message: str | None) -> None:
        """Record ``job``'s progress (thread-safe); it is written within a second."""
        with self._lock:
            self._latest[job.id] = (job.run_count, fraction, message)

    def _take(self) -> dict[int, tuple[int, float, str | None]]:
        with self._lock:
            taken, self._latest = self._latest, {}
        return taken

    async def write(self) -> None:
        """Write what was reported since the last write (one statement)."""
        taken = self._take()
        if not taken:
            return
        ids = list(taken)
        try:
            async with self._connections.connection() as conn:
                await conn.execute(queries.get("progress_write"), {
                    "ids": ids, "run_counts": [taken[i][0] for i in ids],
                    "fractions": [taken[i][1] for i in ids],
                    "messages": [taken[i][2] for i in ids],
                    "now": self._state.settings.sql_now(),
                })
        except Exception as exc:
            with self._lock:  # kept for the next round, unless a newer report came
                self._latest = {**taken, **self._latest}
            self._state.trouble.failed("writing progress", exc, INTERVAL)
        else:
            self._state.trouble.recovered("writing progress")

    async def run(self) -> None:
        """The write loop: at most one write per INTERVAL."""
        while True:
            await asyncio.sleep(INTERVAL)
            await self.write()
