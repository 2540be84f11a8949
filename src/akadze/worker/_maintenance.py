"""Cluster maintenance run from inside the workers, one runner at a time.

Every worker ticks about once a second; whoever gets the maintenance advisory lock
(taken without waiting, so nobody queues up behind it, and scoped to the rescue's
transaction, so that it works through a pooler in transaction mode) does the round,
unless the cluster's last round began less than :data:`ROUND_EVERY` ago (a row of
``akadze.maintenance``, migration 0015): the cluster runs one round per period
however many workers tick, and a tick that finds the round done costs one statement.
The round:

- rescue: delete workers whose lease expired and take back their running jobs;
- end the claims of workers that stopped answering in the middle of a claim (they
  hold the queue's claim turn: every other claim of the queue would wait);
- schedules: enqueue the due fires of periodic schedules (``akadze.schedules``);
- retention: prune old finished jobs (``akadze.retention``), once per
  :data:`PRUNE_EVERY` for the cluster.

No process assumes it is alone: the lock lives in the database, and each step is
safe even if two rounds overlapped (the callees coordinate through the database
too).
"""

from __future__ import annotations

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
    """What one try of a maintenance round did: ``ran`` when this process ran the
    round; ``live``, the workers of the cluster whose lease holds (what the next
    try's delay follows)."""

    ran: bool = False
    live: int = 1
    rescued: list[tuple[int, str]] = field(default_factory=list)  # (job id, new state)
    ended: list[int] = field(default_factory=list)  # pids of unresponsive claims ended
    scheduled: list[int] = field(default_factory=list)
    pruned: int = 0


async def rescue_expired(
    conn: psycopg.AsyncConnection[Any],
    app: Akadze | None,
    *,
    now: datetime | None = None,
    orphan_grace: float = 30.0,
) -> list[tuple[int, str]]:
    """Requeue (or fail, on their last attempt) the running jobs of workers whose
    lease expired; return ``(job id, new state)`` pairs. Runs its own transaction;
    on_transition hooks run in it. (A maintenance round rescues in its turn
    instead: :func:`run_round`.)"""
    async with conn.transaction():
        return await _rescue(conn, app, now, orphan_grace)


@dataclass(frozen=True)
class _Turn:
    """What maintenance_try_lock answered."""

    due: bool  # the lock was free and the cluster's round due: this process runs it
    prune: bool
    live: int


async def _rescue_in_turn(
    conn: psycopg.AsyncConnection[Any], app: Akadze | None, *, now: datetime | None,
    orphan_grace: float, every: float, prune_every: float,
) -> tuple[_Turn, list[tuple[int, str]]]:
    """The rescue of a round, in the maintenance turn: nothing rescued (and ``due``
    false) when another process has the lock or the cluster's last round began less
    than ``every`` seconds ago; else what was rescued, and whether this round prunes
    (``prune_every``)."""
    async with conn.transaction():
        cur = await conn.execute(queries.get("maintenance_try_lock"),
                                 {"every": every, "prune_every": prune_every, "now": now})
        row = await cur.fetchone()
        turn = _Turn(False, False, 1) if row is None else _Turn(
            bool(row[1]), bool(row[2]), max(1, int(row[3] or 0)))
        if not turn.due:
            return turn, []
        return turn, await _rescue(conn, app, now, orphan_grace)


async def _rescue(conn: psycopg.AsyncConnection[Any], app: Akadze | None,
                  now: datetime | None, orphan_grace: float) -> list[tuple[int, str]]:
    """The rescue statement and its hooks, in the caller's transaction."""
    cur = await conn.cursor(row_factory=job_state_rows).execute(
        queries.get("rescue_expired"), {"now": now, "orphan_grace": orphan_grace})
    rows = await cur.fetchall()
    # the reservations of the workers gone (deleted just now, or ended unseen)
    await conn.execute(queries.get("rescue_reserved"))
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


async def end_unresponsive_claims(conn: psycopg.AsyncConnection[Any], *,
                                  after: float) -> list[int]:
    """End the sessions that hold a queue's claim turn and have waited for their client
    longer than ``after`` seconds (``end_unresponsive_claims``); their pids."""
    cur = await conn.execute(queries.get("end_unresponsive_claims"), {"after": after})
    ended = []
    for pid, name, waited, _ in await cur.fetchall():
        ended.append(int(pid))
        logger.warning(
            "ended the session %s (%s) that held the claim turn of a queue without answering "
            "for %.1f s (a worker that stopped answering: a partitioned network or a stopped "
            "process); its claim rolled back", pid, name, waited,
            extra={"pid": pid})
    return ended


async def run_round(
    conn: psycopg.AsyncConnection[Any],
    app: Akadze,
    *,
    now: datetime,
    sql_now: datetime | None = None,
    orphan_grace: float = 30.0,
    idle_limit: float = 30.0,
    every: float = 0.0,
    prune_every: float | None = None,
) -> Round:
    """One maintenance round if this process gets the lock and the cluster's last
    round began ``every`` seconds ago or more (else ``ran`` is false). ``conn`` is an autocommit
    connection outside any transaction. The lock is held by the rescue's transaction
    only: nothing outlives a transaction on the connection. The lock holder also ends
    the claims that stopped answering while holding a queue's turn for ``idle_limit``
    seconds (``end_unresponsive_claims``), enqueues due schedule fires and, when the
    cluster's last prune began ``prune_every`` seconds ago or more, prunes (None:
    never)."""
    turn, rescued = await _rescue_in_turn(
        conn, app, now=sql_now, orphan_grace=orphan_grace, every=every,
        prune_every=prune_every if prune_every is not None else float("inf"))
    done = Round(ran=turn.due, live=turn.live, rescued=rescued)
    if not turn.due:
        return done
    done.ended = await end_unresponsive_claims(conn, after=idle_limit)
    done.scheduled = list(await schedules.enqueue_due(conn, app, now))
    if turn.prune and prune_every is not None:
        done.pruned = int(await retention.prune(conn, app, now))
    return done


#: How often the cluster runs a maintenance round (whoever tries first once this
#: much has passed since the last one began: one round per period however many
#: workers try), and how often a round prunes.
ROUND_EVERY = 0.8
PRUNE_EVERY = 60.0
#: How often a worker tries, jittered: about TRIES_PER_SECOND tries a second for the
#: whole cluster (each of N live workers every N / TRIES_PER_SECOND seconds), at
#: least every MAINTENANCE_EVERY and at most every MAINTENANCE_MOST (nor a sixth of
#: the lease), so that a worker left alone after many died still rescues promptly.
MAINTENANCE_EVERY = 1.0
TRIES_PER_SECOND = 3.0
MAINTENANCE_MOST = 10.0


def try_every(live: int, lease: float) -> float:
    """Seconds between a worker's tries of the maintenance round, with ``live`` workers
    in the cluster (before jitter)."""
    stretched = min(live / TRIES_PER_SECOND, MAINTENANCE_MOST, lease / 6)
    return max(MAINTENANCE_EVERY, stretched)


class MaintenanceLoop:
    """The worker's part in cluster maintenance: a round every second or so."""

    def __init__(self, state: WorkerState, connections: Connections) -> None:
        self._state = state
        self._connections = connections

    async def run(self) -> None:
        state, settings = self._state, self._state.settings
        await state.registered.wait()
        every = MAINTENANCE_EVERY
        while not state.stopping:
            if not state.lease_held():
                # Only a worker whose own lease holds takes the lock and rescues: one
                # that has just reconnected (or is fenced) waits for its renewal, so it
                # never judges others' leases before its own is settled.
                await state.sleep(MAINTENANCE_EVERY * state.random.uniform(0.8, 1.2))
                continue
            try:
                async with self._connections.connection() as conn:
                    done = await run_round(
                        conn, settings.app, now=settings.wall_now(),
                        sql_now=settings.sql_now(), orphan_grace=settings.lease,
                        idle_limit=settings.lease, every=ROUND_EVERY,
                        prune_every=PRUNE_EVERY,
                    )
            except Exception as exc:
                every = MAINTENANCE_EVERY
                state.trouble.failed("maintenance", exc, every)
            else:
                state.trouble.recovered("maintenance")
                every = try_every(done.live, settings.lease)
                if done.pruned:
                    logger.info("pruned %d finished jobs", done.pruned)
            await state.sleep(every * state.random.uniform(0.8, 1.2))
