"""Workers through PgBouncer in transaction pooling mode (the tests' own, on a private
port: the ``pgbouncer`` fixture), with the stock ``ignore_startup_parameters``.

Every transaction a worker sends may land on another server connection: nothing may
live in the session (no startup options, no session locks, no server-side prepared
statements). The database is checked over a direct connection (``conn``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest
from worker_support import Events, eventually, insert_job, wait_state

from akadze import Akadze, Worker, current
from akadze.bench import queries as harness

Conn = psycopg.Connection[Any]


def _no_trouble(caplog: pytest.LogCaptureFixture, bouncer: Any) -> None:
    """Nothing went wrong quietly: no worker error or warning, nothing PgBouncer
    refused (a startup parameter) and no unknown prepared statement."""
    troubles = [r.getMessage() for r in caplog.records
                if r.name.startswith("akadze") and r.levelno >= logging.WARNING]
    assert troubles == []
    log = bouncer.log()
    assert "unsupported startup parameter" not in log
    assert "prepared statement" not in log


async def test_two_workers_run_every_job_once_within_limits(
    pgbouncer: Any, pgbouncer_url: str, database_url: str, conn: Conn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    app = Akadze(database_url=database_url)
    peak: dict[str, int] = {}

    @app.task("plain", queue="q")
    def plain(n: int) -> None:
        # complete_tx of a thread task: the worker's sync pool, through PgBouncer
        with current().complete_tx(result={"n": n}) as tx:
            tx.execute("SELECT 1")

    @app.task("coro", queue="q")
    async def coro(n: int) -> None:
        async with current().complete_tx(result={"n": n}) as tx:
            await tx.execute("SELECT 1")

    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES ('k0', 2), ('k1', 3)")
    with psycopg.connect(database_url) as enqueuing:
        for n in range(300):
            task = plain if n % 2 else coro
            key = ("k0", "k1", None)[n % 3]
            task.using(session=enqueuing, limit_key=key).enqueue_sync(n=n)
    conn.execute(harness.get("watch_install"))

    workers = [Worker(app, database_url=pgbouncer_url, transaction_pooling=True, slots=10,
                      fair=bool(i), poll_interval=0.05) for i in range(2)]
    # No listen_url: through a pooler in transaction mode the worker polls.
    assert [w.listen for w in workers] == [False, False]
    async with workers[0], workers[1]:
        await eventually(lambda: conn.execute(
            "SELECT count(*) = 300 FROM akadze.jobs WHERE state = 'succeeded'").fetchone()[0],
            within=60, what="every job to succeed")
    rows = conn.execute("SELECT max(run_count), count(*) FILTER (WHERE result IS NULL) "
                        "FROM akadze.jobs").fetchone()
    assert rows == (1, 0)  # each ran once, and wrote its result in its complete_tx
    violations = conn.execute(harness.get("watch_violations")).fetchone()
    assert violations is not None and violations[0] == 0
    peak = dict(conn.execute(harness.get("watch_running_peaks")).fetchall())
    assert peak.get("k0", 0) <= 2 and peak.get("k1", 0) <= 3
    _no_trouble(caplog, pgbouncer)


async def test_listen_url_keeps_notifications_beside_pgbouncer(
    pgbouncer: Any, pgbouncer_url: str, database_url: str, conn: Conn,
) -> None:
    app = Akadze(database_url=database_url)
    started: list[float] = []

    @app.task("t")
    async def t() -> None:
        started.append(time.monotonic())

    events = Events()
    # Polling once a minute: only a notification starts the job quickly.
    async with Worker(app, database_url=pgbouncer_url, transaction_pooling=True,
                      listen_url=database_url, poll_interval=60, on_event=events) as worker:
        assert worker.listen
        await events.next("listening")
        committed = time.monotonic()
        job_id = insert_job(conn, "t")
        await wait_state(conn, job_id, "succeeded", within=10)
    assert started[-1] - committed < 5.0


async def test_a_dead_workers_job_is_rescued_through_pgbouncer(
    pgbouncer: Any, pgbouncer_url: str, database_url: str, conn: Conn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    app = Akadze(database_url=database_url)

    @app.task("t")
    async def t() -> None:
        return None

    conn.execute("INSERT INTO akadze.workers (id, host, pid, queues, lease, heartbeat_at) "
                 "VALUES ('gone', 'h', 1, '{default}', interval '1 second', "
                 "now() - interval '1 hour')")
    job_id = insert_job(conn, "t", state="running", worker_id="gone", run_count=1, attempt=1,
                        started_at=None)
    conn.execute("UPDATE akadze.jobs SET started_at = now() - interval '1 hour' WHERE id = %s",
                 (job_id,))
    async with Worker(app, database_url=pgbouncer_url, transaction_pooling=True,
                      poll_interval=0.05):
        row = await wait_state(conn, job_id, "succeeded", within=20)
    assert row["run_count"] == 2
    # The maintenance lock lived in the rescue's transaction: nothing is left behind
    # on PgBouncer's server connections.
    held = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                        " AND database = (SELECT oid FROM pg_database"
                        " WHERE datname = current_database())").fetchone()
    assert held == (0,)
    assert not [r for r in caplog.records if r.name.startswith("akadze")]
