"""Retention: finished jobs past their retention are deleted in bounded batches, failed
jobs are kept longer, one pruner at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from akadze import Akadze
from akadze.retention import prune, prune_sync

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def seed(conn: psycopg.Connection[Any], state: str, count: int, age: timedelta) -> None:
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, state, finished_at) "
        "SELECT 'q', 't', %s::akadze.job_state, %s FROM generate_series(1, %s)",
        (state, NOW - age, count),
    )


def by_state(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state::text, count(*) FROM akadze.jobs GROUP BY state"
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def test_prune_in_batches_keeps_recent_and_failed(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    app = Akadze(database_url=database_url)  # retention 7 days, failed 28 days
    seed(conn, "succeeded", 2500, timedelta(days=8))
    seed(conn, "cancelled", 30, timedelta(days=9))
    seed(conn, "succeeded", 40, timedelta(days=6))
    seed(conn, "failed", 20, timedelta(days=10))
    seed(conn, "failed", 5, timedelta(days=29))
    conn.execute("INSERT INTO akadze.jobs (queue, task) SELECT 'q', 't' "
                 "FROM generate_series(1, 7)")
    # Bounded: one call with max_batches=2 of 1 000 deletes exactly 2 000.
    assert prune_sync(conn, app, NOW, max_batches=2) == 2000
    assert prune_sync(conn, app, NOW, batch_size=100) == 500 + 30 + 5
    assert by_state(conn) == {"succeeded": 40, "failed": 20, "queued": 7}
    assert prune_sync(conn, app, NOW) == 0


async def test_one_pruner_at_a_time(database_url: str, conn: psycopg.Connection[Any],
                                    aconn: psycopg.AsyncConnection[Any]) -> None:
    app = Akadze(database_url=database_url, retention=timedelta(days=1))
    seed(conn, "succeeded", 10, timedelta(days=2))
    # Another process holds the retention lock: this call returns 0 at once.
    conn.execute("SELECT pg_advisory_lock(7019811528365142644)")
    assert await prune(aconn, app, NOW) == 0
    conn.execute("SELECT pg_advisory_unlock(7019811528365142644)")
    assert await prune(aconn, app, NOW) == 10
    # The lock was released: a second pruner gets it.
    assert prune_sync(conn, app, NOW) == 0
    # Nothing outlives a batch's transaction (the lock is transaction-scoped): none
    # is held in this database (other tests' databases have their own).
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database"
                       " = (SELECT oid FROM pg_database WHERE datname = current_database())"
                       ).fetchone()
    assert row == (0,)


def test_old_fire_records_are_pruned_unless_their_job_is_active(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    app = Akadze(database_url=database_url)
    active = conn.execute("INSERT INTO akadze.jobs (queue, task) VALUES ('q', 't') "
                          "RETURNING id").fetchone()
    assert active
    conn.execute(
        "INSERT INTO akadze.periodic_fires (schedule, fire_at, job_id) VALUES "
        "('s', %s, NULL), ('s', %s, %s), ('s', %s, NULL)",
        (NOW - timedelta(days=30), NOW - timedelta(days=20), active[0], NOW - timedelta(hours=1)),
    )
    prune_sync(conn, app, NOW)
    rows = conn.execute("SELECT fire_at FROM akadze.periodic_fires ORDER BY fire_at").fetchall()
    assert rows == [(NOW - timedelta(days=20),), (NOW - timedelta(hours=1),)]


def test_prune_batch_reads_the_finished_index(conn: psycopg.Connection[Any]) -> None:
    from akadze import queries

    conn.execute("SET enable_seqscan = off")
    plan = conn.execute(
        "EXPLAIN " + queries.text("retention_prune_batch"),
        {"cutoff": NOW, "failed_cutoff": NOW, "batch": 1000},
    ).fetchall()
    assert "jobs_finished_idx" in "\n".join(str(r[0]) for r in plan)
