"""Operator actions and reads against a real database: pause/resume, requeue, retry_now,
list_jobs, get_job, queue_snapshot, list_workers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.claim import claim
from akadze.control import (
    pause_queue,
    pause_queue_sync,
    requeue,
    requeue_sync,
    resume_queue,
    resume_queue_sync,
    retry_now,
    retry_now_sync,
)
from akadze.errors import DuplicateJob, InvalidJobState, JobNotFound
from akadze.jobs import JobState
from akadze.overview import (
    FilterError,
    get_job,
    get_job_sync,
    list_jobs,
    list_jobs_sync,
    list_workers,
    list_workers_sync,
    queue_snapshot,
    queue_snapshot_sync,
)
from akadze.testing import drain


@pytest.fixture
def ops_app(app: Akadze) -> Akadze:
    @app.task("work", queue="q1", max_attempts=2)
    def work(n: int = 0) -> int:
        return n

    @app.task("boom", queue="q2", max_attempts=1)
    def boom() -> None:
        raise ValueError("it broke at https://user:hunter2@example.com/x")

    return app


def state_of(conn: psycopg.Connection[Any], job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT state::text, attempt, run_count, jsonb_array_length(errors) "
        "FROM akadze.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


async def test_requeue_a_failed_job_keeps_its_history(
    ops_app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    job_id = await ops_app.tasks["boom"].using().enqueue()
    outcome = await drain(ops_app)
    assert outcome["failed"] == 1
    assert state_of(conn, job_id) == ("failed", 1, 1, 1)
    await requeue(ops_app, job_id)
    assert state_of(conn, job_id) == ("queued", 0, 1, 1)
    job = await get_job(ops_app, job_id)
    assert job.state is JobState.QUEUED and job.finished_at is None
    assert job.errors[0]["error"] == "ValueError"
    assert "hunter2" not in str(job.errors)
    # It runs (and fails) again: the history grows.
    await drain(ops_app)
    assert state_of(conn, job_id) == ("failed", 1, 2, 2)
    with pytest.raises(InvalidJobState, match="only failed or cancelled"):
        await requeue(ops_app, (await ops_app.tasks["work"].using().enqueue(n=1)))
    with pytest.raises(JobNotFound, match="no job with id 999999"):
        await requeue(ops_app, 999999)


def test_requeue_sync_cancelled_and_transaction_joined(
    ops_app: Akadze, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job_id = ops_app.tasks["work"].using().enqueue_sync(n=1)
    conn.execute("UPDATE akadze.jobs SET state = 'cancelled', finished_at = now(), "
                 "attempt = 1 WHERE id = %s", (job_id,))
    seen: list[tuple[int, str, str]] = []
    ops_app.on_transition(lambda c, job, before, after: seen.append((job.id, before, after)))
    # Joined to the caller's transaction: a rollback undoes it.
    with psycopg.connect(database_url) as mine:
        requeue_sync(mine, job_id, app=ops_app)
        mine.rollback()
    assert state_of(conn, job_id)[0] == "cancelled"
    with psycopg.connect(database_url) as mine:
        requeue_sync(mine, job_id, app=ops_app)
        mine.commit()
    assert state_of(conn, job_id)[:2] == ("queued", 0)
    assert seen[-1] == (job_id, "cancelled", "queued")


def test_requeue_refuses_a_taken_unique_key(
    ops_app: Akadze, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    old = ops_app.tasks["work"].using(unique_key="k").enqueue_sync(n=1)
    conn.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
                 (old,))
    ops_app.tasks["work"].using(unique_key="k").enqueue_sync(n=2)
    with psycopg.connect(database_url) as mine:
        with pytest.raises(DuplicateJob, match="'k'"):
            requeue_sync(mine, old)
        # The caller's transaction is still usable.
        assert mine.execute("SELECT 1").fetchone() == (1,)
    assert state_of(conn, old)[0] == "failed"


async def test_retry_now(ops_app: Akadze, conn: psycopg.Connection[Any]) -> None:
    later = await ops_app.tasks["work"].using(delay=timedelta(hours=1)).enqueue(n=1)
    ready = await ops_app.tasks["work"].using().enqueue(n=2)
    assert await retry_now(ops_app, later) is True
    assert retry_now_sync(ops_app.database_url, ready) is False
    row = conn.execute("SELECT run_at <= now() FROM akadze.jobs WHERE id = %s",
                       (later,)).fetchone()
    assert row == (True,)
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                 "WHERE id = %s", (ready,))
    with pytest.raises(InvalidJobState, match="retry_now applies to queued jobs"):
        await retry_now(ops_app, ready)
    with pytest.raises(JobNotFound):
        retry_now_sync(ops_app, 424242)


async def test_pause_stops_claims_and_resume_restores_them(
    ops_app: Akadze, database_url: str, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await ops_app.tasks["work"].using().enqueue(n=1)
    assert await pause_queue(ops_app, "q1") is True
    assert pause_queue_sync(ops_app, "q1") is False
    assert await claim(aconn, queue="q1", slots=5) == []
    snapshot = await queue_snapshot(ops_app, "q1")
    assert snapshot.paused and snapshot.ready == 1
    assert resume_queue_sync(database_url, "q1") is True
    assert await resume_queue(ops_app, "q1") is False
    claimed = await claim(aconn, queue="q1", slots=5)
    assert len(claimed) == 1


async def test_list_jobs_filters(ops_app: Akadze) -> None:
    work = ops_app.tasks["work"]
    a = await work.using(meta={"tenant": "acme", "tier": 1}).enqueue(n=1)
    b = await work.using(meta={"tenant": "globex"}).enqueue(n=2)
    c = await ops_app.tasks["boom"].using(meta={"tenant": "acme"}).enqueue()
    assert [j.id for j in await list_jobs(ops_app)] == [c, b, a]
    assert [j.id for j in await list_jobs(ops_app, meta={"tenant": "acme"})] == [c, a]
    assert [j.id for j in await list_jobs(ops_app, meta={"tenant": "acme", "tier": 1})] == [a]
    assert [j.id for j in await list_jobs(ops_app, queue="q1")] == [b, a]
    assert [j.id for j in await list_jobs(ops_app, task="boom")] == [c]
    assert [j.id for j in list_jobs_sync(ops_app, state="queued", limit=2)] == [c, b]
    assert list_jobs_sync(ops_app, state=["failed", "running"]) == []
    job = get_job_sync(ops_app, a)
    assert job.args == {"n": 1} and job.meta == {"tenant": "acme", "tier": 1}
    with pytest.raises(FilterError, match="unknown job state 'done'"):
        await list_jobs(ops_app, state="done")
    with pytest.raises(FilterError, match="limit"):
        await list_jobs(ops_app, limit=0)
    with pytest.raises(JobNotFound):
        get_job_sync(ops_app, 10**9)


def test_meta_filter_uses_the_gin_index(ops_app: Akadze, conn: psycopg.Connection[Any]) -> None:
    from akadze import queries

    conn.execute("SET enable_seqscan = off")
    plan = conn.execute(
        "EXPLAIN " + queries.text("jobs_list_meta"),
        {"meta": '{"tenant": "acme"}', "queue": None, "states": None, "task": None,
         "limit": 10},
    ).fetchall()
    assert "jobs_meta_idx" in "\n".join(str(r[0]) for r in plan)


async def test_queue_snapshot_counts_and_lag(
    ops_app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    work = ops_app.tasks["work"]
    ids = [await work.using().enqueue(n=i) for i in range(4)]
    await work.using(delay=timedelta(hours=1)).enqueue(n=9)
    conn.execute("UPDATE akadze.jobs SET run_at = now() - interval '90 seconds' WHERE id = %s",
                 (ids[0],))
    conn.execute("UPDATE akadze.jobs SET state = 'running', started_at = now() WHERE id = %s",
                 (ids[1],))
    conn.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
                 (ids[2],))
    await pause_queue(ops_app, "empty-but-paused")
    snapshots = await queue_snapshot(ops_app)
    assert [s.queue for s in snapshots] == ["empty-but-paused", "q1"]
    q1 = snapshots[1]
    assert (q1.ready, q1.scheduled, q1.busy) == (2, 1, 1)
    assert q1.count("queued") == 3 and q1.count(JobState.FAILED) == 1 and q1.total == 5
    assert q1.lag is not None and timedelta(seconds=89) < q1.lag < timedelta(seconds=120)
    assert not q1.paused and snapshots[0].paused and snapshots[0].total == 0
    fixed = queue_snapshot_sync(ops_app, "q1", now=datetime.now(UTC) + timedelta(hours=2))
    assert (fixed.ready, fixed.scheduled) == (3, 0)
    unknown = queue_snapshot_sync(ops_app, "nothing-here")
    assert unknown.total == 0 and unknown.lag is None and not unknown.paused


async def test_list_workers(ops_app: Akadze, conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO akadze.workers (id, host, pid, queues, lease, heartbeat_at) VALUES "
        "('w-live', 'box', 10, '{q1,q2}', '30 seconds', now()), "
        "('w-dead', 'box', 11, '{q1}', '30 seconds', now() - interval '5 minutes')"
    )
    job_id = await ops_app.tasks["work"].using().enqueue(n=1)
    conn.execute("UPDATE akadze.jobs SET state = 'running', worker_id = 'w-live' "
                 "WHERE id = %s", (job_id,))
    workers = {w.id: w for w in await list_workers(ops_app)}
    assert workers["w-live"].alive and workers["w-live"].running == 1
    assert workers["w-live"].queues == ("q1", "q2")
    assert not workers["w-dead"].alive and workers["w-dead"].running == 0
    assert {w.id for w in list_workers_sync(ops_app)} == {"w-live", "w-dead"}


async def test_reads_accept_an_sqlalchemy_async_engine(ops_app: Akadze) -> None:
    job_id = await ops_app.tasks["work"].using().enqueue(n=7)
    engine = ops_app.engine
    try:
        assert (await get_job(engine, job_id)).args == {"n": 7}
        assert [j.id for j in await list_jobs(engine)] == [job_id]
        assert (await queue_snapshot(engine, "q1")).ready == 1
        assert await list_workers(engine) == []
    finally:
        await engine.dispose()
