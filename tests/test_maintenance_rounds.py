"""One maintenance round per period for the whole cluster (migration 0015).

Every worker tries a round about once a second; the lock holder runs it only when
the cluster's last round began ``every`` seconds ago, so a hundred idle workers run
about one round a second between them, not a hundred.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from akadze import Akadze
from akadze.worker._maintenance import (
    MAINTENANCE_EVERY,
    MAINTENANCE_MOST,
    PRUNE_EVERY,
    ROUND_EVERY,
    TRIES_PER_SECOND,
    run_round,
    try_every,
)

Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]


def _marks(conn: Conn) -> tuple[datetime, datetime]:
    row = conn.execute("SELECT last_round_at, last_pruned_at FROM akadze.maintenance").fetchone()
    assert row is not None
    return row[0], row[1]


async def _round(aconn: AConn, app: Akadze, every: float = 3600.0) -> Any:
    return await run_round(aconn, app, now=datetime.now(UTC), every=every,
                           prune_every=PRUNE_EVERY)


async def test_a_round_runs_once_per_period_for_the_cluster(
    app: Akadze, conn: Conn, aconn: AConn,
) -> None:
    first = await _round(aconn, app)
    assert first.ran
    began, pruned = _marks(conn)
    assert began == pruned  # the first round prunes too: the cluster never pruned
    # Within the period every other try finds the round done, and touches nothing.
    for _ in range(5):
        assert not (await _round(aconn, app)).ran
    assert _marks(conn) == (began, pruned)
    # A period later (the mark moved back as time would move on), a round again,
    # this time without pruning: the last prune began less than PRUNE_EVERY ago.
    conn.execute("UPDATE akadze.maintenance SET last_round_at = last_round_at - interval '2 hours'")
    again = await _round(aconn, app)
    assert again.ran and again.pruned == 0
    began_again, pruned_again = _marks(conn)
    assert began_again > began and pruned_again == pruned


async def test_the_period_is_the_one_asked_for(app: Akadze, conn: Conn, aconn: AConn) -> None:
    assert (await _round(aconn, app, every=ROUND_EVERY)).ran
    # Marked a period ago: due again.
    conn.execute("UPDATE akadze.maintenance SET last_round_at = now() - %s * interval '1 second'",
                 (ROUND_EVERY + 0.05,))
    assert (await _round(aconn, app, every=ROUND_EVERY)).ran
    # Marked just under a period ago: not due.
    conn.execute("UPDATE akadze.maintenance SET last_round_at = now() - %s * interval '1 second'",
                 (ROUND_EVERY / 2,))
    assert not (await _round(aconn, app, every=ROUND_EVERY)).ran


async def test_a_mark_in_the_future_does_not_hold_rounds_off(
    app: Akadze, conn: Conn, aconn: AConn,
) -> None:
    # The server's clock stepped back after a round.
    conn.execute("UPDATE akadze.maintenance SET last_round_at = now() + interval '1 day'")
    assert (await _round(aconn, app)).ran
    began, _ = _marks(conn)
    assert began <= datetime.now(UTC)


async def test_a_try_while_another_holds_the_lock_neither_waits_nor_runs(
    app: Akadze, database_url: str, conn: Conn, aconn: AConn,
) -> None:
    with psycopg.connect(database_url) as holder:
        holder.execute("SET lock_timeout = '5s'")
        # Another process's round in progress: its lock and its mark, uncommitted.
        locked = holder.execute("SELECT pg_try_advisory_xact_lock(7019811528365141364)"
                                ).fetchone()
        assert locked == (True,)
        holder.execute("UPDATE akadze.maintenance SET last_round_at = now()")
        await aconn.execute("SET lock_timeout = '2s'")  # a wait on the row would fail
        assert not (await _round(aconn, app, every=0.0)).ran
        holder.rollback()
    # Its round failed (rolled back): the period's round is still due.
    assert (await _round(aconn, app)).ran


async def test_a_round_that_fails_leaves_the_round_due(
    app: Akadze, conn: Conn, aconn: AConn,
) -> None:
    # A job running for a worker that has no row (long gone): the rescue takes it back.
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, state, worker_id, started_at, attempt)"
        " VALUES ('q', 'noop', 'running', 'gone', now() - interval '1 hour', 1)")

    def refuse(*_: object) -> None:
        raise RuntimeError("a hook that fails the rescue")

    app.on_transition_hooks.append(refuse)
    try:
        try:
            await _round(aconn, app)
        except RuntimeError:
            pass
        else:
            raise AssertionError("the rescue's hook did not fail the round")
    finally:
        app.on_transition_hooks.remove(refuse)
    never = conn.execute("SELECT last_round_at = '-infinity' FROM akadze.maintenance").fetchone()
    assert never == (True,)
    rescued = await _round(aconn, app)
    assert rescued.ran and [state for _, state in rescued.rescued] == ["queued"]


async def test_a_try_counts_the_live_workers(app: Akadze, conn: Conn, aconn: AConn) -> None:
    conn.execute(
        "INSERT INTO akadze.workers (id, host, pid, queues) SELECT 'w' || n, 'h', n, '{q}'"
        " FROM generate_series(1, 12) n")
    conn.execute("UPDATE akadze.workers SET heartbeat_at = now() - interval '1 hour'"
                 " WHERE id IN ('w1', 'w2')")  # their leases ran out
    done = await _round(aconn, app)
    assert done.live == 10
    # A try that finds the round done counts them too (it spaces the next try).
    conn.execute("DELETE FROM akadze.workers WHERE id IN ('w3', 'w4', 'w5')")
    again = await _round(aconn, app)
    assert not again.ran and again.live == 7


def test_tries_spread_over_the_cluster() -> None:
    assert try_every(1, 30.0) == MAINTENANCE_EVERY
    assert try_every(3, 30.0) == MAINTENANCE_EVERY
    assert try_every(15, 30.0) == 15 / TRIES_PER_SECOND
    assert try_every(100, 30.0) == min(MAINTENANCE_MOST, 5.0)  # a sixth of the lease
    assert try_every(100, 600.0) == MAINTENANCE_MOST
    assert try_every(100, 1.0) == MAINTENANCE_EVERY  # a short lease: never slower
