"""Leases: rescue of a dead worker's jobs, and self-fencing of a worker that cannot
renew its own lease."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from worker_support import Events, eventually, insert_job, job, wait_event, wait_state

from akadze import Akadze, Worker, current
from akadze.worker._leases import HEARTBEAT_SPREAD, renew_in


def dead_worker(conn: psycopg.Connection[Any], worker_id: str = "dead") -> None:
    conn.execute(
        "INSERT INTO akadze.workers (id, host, pid, lease, started_at, heartbeat_at) "
        "VALUES (%s, 'gone', 1, interval '30 seconds', now() - interval '2 hours', "
        "now() - interval '1 hour')", (worker_id,))


def running_job(conn: psycopg.Connection[Any], task: str, worker_id: str, *, attempt: int,
                max_attempts: int = 3) -> int:
    job_id = insert_job(conn, task, max_attempts=max_attempts)
    conn.execute(
        "UPDATE akadze.jobs SET state = 'running', attempt = %s, run_count = %s, worker_id = %s, "
        "started_at = now() - interval '1 hour', run_at = '2020-01-01T00:00:00Z' WHERE id = %s",
        (attempt, attempt, worker_id, job_id))
    return job_id


async def test_the_jobs_of_a_worker_whose_lease_expired_are_rescued(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    runs: list[tuple[int, int]] = []

    @app.task("t")
    async def t() -> None:
        runs.append((current().id, current().attempt))

    dead_worker(conn)
    again = running_job(conn, "t", "dead", attempt=1)
    last = running_job(conn, "t", "dead", attempt=3, max_attempts=3)
    kept = running_job(conn, "not_registered_here", "dead", attempt=1)
    orphan = running_job(conn, "t", "never-registered", attempt=1)
    transitions: list[tuple[int, str, str]] = []

    @app.on_transition
    def record(db: Any, job: Any, old: str, new: str) -> None:
        transitions.append((job.id, old, new))

    async with Worker(app, poll_interval=0.05):
        row = await wait_state(conn, again, "succeeded")
        failed = await wait_state(conn, last, "failed")
        requeued = await wait_state(conn, kept, "queued")
        await wait_state(conn, orphan, "succeeded")
    assert (row["attempt"], row["run_count"]) == (2, 2)
    assert row["errors"][0]["error"] == "WorkerLost"
    assert failed["errors"][0]["error"] == "WorkerLost" and failed["finished_at"] is not None
    # The rescued job keeps its place in the queue (its original run_at).
    assert requeued["run_at"].year == 2020 and requeued["attempt"] == 1
    assert sorted(runs) == sorted([(again, 2), (orphan, 2)])
    assert (again, "running", "queued") in transitions
    assert (last, "running", "failed") in transitions
    assert conn.execute("SELECT count(*) FROM akadze.workers WHERE id = 'dead'").fetchone() == (0,)


async def test_a_worker_that_cannot_renew_its_lease_gives_its_jobs_back(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="akadze.worker")
    started = asyncio.Event()
    interrupted = asyncio.Event()

    @app.task("t")
    async def t() -> str:
        if current().run_count == 1:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                interrupted.set()
                raise
        return "second run"

    job_id = insert_job(conn, "t")
    blocker = psycopg.connect(database_url)
    events = Events()
    try:
        async with Worker(app, lease=1.0, poll_interval=0.05, on_event=events):
            await wait_event(started)
            # The worker's heartbeats now block until the lock is released.
            blocker.execute("LOCK TABLE akadze.workers IN ACCESS EXCLUSIVE MODE")
            await wait_event(interrupted, 5)
            row = await wait_state(conn, job_id, "queued")
            assert (row["attempt"], row["run_count"]) == (0, 1)  # given back, not spent
            fenced = events.find("fenced")  # and not renewed since:
            assert fenced is not None and events.find("lease_renewed", after=fenced) is None
            assert events.seen[fenced].job_ids == (job_id,)
            # Not claimed while fenced: the heartbeat fails twice more meanwhile (about
            # two thirds of a lease, a dozen turns of the claim loop at 0.05 s polls).
            failures = caplog.text.count("heartbeat failed again")
            await eventually(
                lambda: caplog.text.count("heartbeat failed again") >= failures + 2,
                what="two more failed heartbeats while fenced")
            assert events.find("claimed", after=fenced) is None
            assert job(conn, job_id)["state"] == "queued"
            blocker.rollback()
            done = await wait_state(conn, job_id, "succeeded")
    finally:
        blocker.close()
    assert done["result"] == "second run" and (done["attempt"], done["run_count"]) == (1, 2)
    assert "could not renew its lease" in caplog.text
    assert "claiming again" in caplog.text


async def test_a_worker_refuses_a_database_without_the_schema(
    empty_database_url: str,
) -> None:
    from akadze import WorkerError

    app = Akadze(empty_database_url)

    @app.task("t")
    async def t() -> None:
        return None

    with pytest.raises(WorkerError, match="akadze migrate"):
        async with Worker(app):
            pass


async def test_the_heartbeat_row_lives_while_the_worker_runs(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    async with Worker(app, queues=["default", "other"], worker_id="w-1", lease=2) as worker:
        row = await eventually(lambda: conn.execute(
            "SELECT queues, extract(epoch FROM lease) FROM akadze.workers WHERE id = 'w-1'"
        ).fetchone())
        assert row[0] == ["default", "other"] and float(row[1]) == 2.0
        assert worker.worker_id == "w-1"
    assert conn.execute("SELECT count(*) FROM akadze.workers").fetchone() == (0,)


@given(interval=st.floats(0.01, 3600), draw=st.floats(0, 1, exclude_max=True))
def test_heartbeats_are_spread_but_never_late(interval: float, draw: float) -> None:
    delay = renew_in(interval, draw)
    assert interval * (1 - HEARTBEAT_SPREAD) - 1e-9 <= delay <= interval
    # Workers drawing differently renew at different moments.
    spread = renew_in(interval, 0.0) - renew_in(interval, 0.5)
    assert spread >= interval * HEARTBEAT_SPREAD / 2 - 1e-9
