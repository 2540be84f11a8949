"""After a lost connection: does this worker still own the jobs it runs?

A claim commits asynchronously by default, so a server crash, or a failover to an
asynchronous standby, can undo a claim whose run has started here; a connection that
stopped answering for longer than the lease lets another worker rescue the jobs. The
fence (the claim token) already refuses anything such a run would write; this check
makes the worker notice at once, instead of running the job to the end for nothing:
whenever something suggests the connection was lost (a database call that had
failed works again, the LISTEN connection came back, the heartbeat shows that the
server restarted or that this worker had been presumed dead), the worker asks the
database which of its runs are still claimed by them, with their tokens, once its
lease is renewed. A run that lost its job is ended like a fenced-out stale finish:
its outcome is dropped, with one log line, never written (``Runner.lose``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from .. import queries
from ..jobs import ClaimedJob
from ._finishes import token_array
from ._state import WorkerState

logger = logging.getLogger("akadze.worker")


async def lost_runs(conn: psycopg.AsyncConnection[Any], worker_id: str,
                    runs: Sequence[ClaimedJob]) -> list[int]:
    """The ids of ``runs`` (claimed by ``worker_id``) that the database no longer has
    claimed by them."""
    if not runs:
        return []
    cur = await conn.execute(queries.get("worker_runs_lost"), {
        "ids": "{" + ",".join(str(job.id) for job in runs) + "}",
        "tokens": token_array([job.claim_token for job in runs]),
        "run_counts": "{" + ",".join(str(job.run_count) for job in runs) + "}",
        "worker_id": worker_id,
    }, prepare=False)
    return [int(str(row[0])) for row in await cur.fetchall()]


class OwnershipCheck:
    """Remembers that a check is due, and runs it (the lease keeper calls :meth:`run`
    right after a renewal, on the same connection)."""

    def __init__(self, state: WorkerState, *, lose: Callable[[list[int], str], object]) -> None:
        self._state = state
        self._lose = lose
        self._why: str | None = None
        #: Called when a check becomes due (the lease keeper renews at once).
        self.on_wanted: Callable[[], None] | None = None

    @property
    def wanted(self) -> bool:
        return self._why is not None

    def want(self, why: str) -> None:
        """Check the runs after the next renewal of the lease; ``why`` is logged."""
        if self._why is None:
            self._why = why
            if self.on_wanted is not None:
                self.on_wanted()

    async def run(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Check the runs in progress if a check is due; end the lost ones."""
        why = self._why
        if why is None:
            return
        state = self._state
        # Runs whose outcome is decided are left to the fence (the flusher reports
        # a refusal): only those still going can be ended early.
        runs = [run.job for run in state.running.values() if not run.recorded]
        lost = await lost_runs(conn, state.settings.worker_id, runs)
        self._why = None  # done (a failure above leaves it due)
        logger.debug("checked %d running job%s after %s: %d lost", len(runs),
                     "" if len(runs) == 1 else "s", why, len(lost))
        if lost:
            self._lose(lost, why)
