"""Cluster maintenance run from inside the workers, one runner at a time.

Every worker ticks periodically; whoever gets the maintenance advisory lock (taken
without waiting, so nobody queues up behind it, and scoped to the rescue's
transaction, so that it works through a pooler in transaction mode) does the round:

- rescue: delete workers whose lease expired and take back their running jobs;
- schedules: enqueue the due fires of periodic schedules (``akadze.schedules``);
- retention: prune old finished jobs (``akadze.retention``), less often.

No process assumes it is alone: the lock lives in the database, and each step is
safe even if two rounds overlapped (the callees coordinate through the database
too).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from .. import queries, retention, schedules
from ..app import Akadze
from ..hooks import call_transition_hooks
from ..jobs import job_state_rows
from ._connections import Connections
from ._state import WorkerState

logger = logging.getLogger("akadze.worker")


@dataclass
class Round:
    """What one maintenance round did."""

    rescued: list[tuple[int, str]] = field(default_factory=list)  # (job id, new state)
    scheduled: list[int] = field(default_factory=list)
    pruned: int = 0


async def rescue_expired(
    conn: psycopg.AsyncConnection[Any],
    app: Akadze | None,
    *,
    now: datetime | None = None,
    orphan_grace: float = 30.0,
    turn: bool = False,
) -> list[tuple[int, str]] | None:
    """Requeue (or fail, on their last attempt) the running jobs of workers whose
    lease expired; return ``(job id, new state)`` pairs. Runs its own transaction;
    on_transition hooks run in it. ``turn``: first take the maintenance lock for
    that transaction, and return None at once when another process has it."""
    params = {"now": now, "orphan_grace": orphan_grace}
    async with conn.transaction():
        if turn:
            locked = await (await conn.execute(queries.get("maintenance_try_lock"))).fetchone()
            if not locked or not locked[0]:
                return None
        cur = await conn.cursor(row_factory=job_state_rows).execute(
            queries.get("rescue_expired"), params)
        rows = await cur.fetchall()
        hooks = app.on_transition_hooks if app is not None else []
        rescued = []
        for job, new_state in rows:
            state = new_state.value
            if hooks:
                await call_transition_hooks(hooks, conn, job, "running", state)
            rescued.append((job.id, state))
    for job_id, state in rescued:
        logger.warning(
            "job %d was rescued from a worker whose lease expired: now %s", job_id, state,
            extra={"job_id": job_id, "state": state},
        )
    return rescued


async def run_round(
    conn: psycopg.AsyncConnection[Any],
    app: Akadze,
    *,
    now: datetime,
    sql_now: datetime | None = None,
    orphan_grace: float = 30.0,
    prune: bool = False,
) -> Round | None:
    """One maintenance round if this process gets the lock (else None). ``conn`` is
    an autocommit connection outside any transaction. The lock is held by the
    rescue's transaction only: nothing outlives a transaction on the connection."""
    rescued = await rescue_expired(conn, app, now=sql_now, orphan_grace=orphan_grace,
                                   turn=True)
    if rescued is None:
        return None
    done = Round(rescued=rescued)
    done.scheduled = list(await schedules.enqueue_due(conn, app, now))
    if prune:
        done.pruned = int(await retention.prune(conn, app, now))
    return done


#: How often the maintenance round is tried, and how often it prunes.
MAINTENANCE_EVERY = 1.0
PRUNE_EVERY = 60.0


class MaintenanceLoop:
    """The worker's part in cluster maintenance: a round every second or so."""

    def __init__(self, state: WorkerState, connections: Connections) -> None:
        self._state = state
        self._connections = connections

    async def run(self) -> None:
        state, settings = self._state, self._state.settings
        loop = asyncio.get_running_loop()
        last_prune = loop.time()
        await state.registered.wait()
        while not state.stopping:
            prune = loop.time() - last_prune >= PRUNE_EVERY
            try:
                async with self._connections.connection() as conn:
                    done = await run_round(
                        conn, settings.app, now=settings.wall_now(),
                        sql_now=settings.sql_now(), orphan_grace=settings.lease,
                        prune=prune,
                    )
            except Exception as exc:
                state.trouble.failed("maintenance", exc, MAINTENANCE_EVERY)
            else:
                state.trouble.recovered("maintenance")
                if done is not None and prune:
                    last_prune = loop.time()
                if done is not None and done.pruned:
                    logger.info("pruned %d finished jobs", done.pruned)
            await state.sleep(MAINTENANCE_EVERY * state.random.uniform(0.8, 1.2))
