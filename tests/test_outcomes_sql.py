"""The SQL under the outcomes: fenced batch writes, bounded errors, NOTIFY trigger."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
from worker_support import insert_job, job

from akadze import outcomes
from akadze.jobs import ClaimedJob, JobState
from akadze.worker._finishes import write

AT = datetime(2026, 1, 1, tzinfo=UTC)


def running(conn: psycopg.Connection[Any], job_id: int) -> ClaimedJob:
    """Mark the job claimed (as a claim would) and return its record."""
    conn.execute(
        "UPDATE akadze.jobs SET state = 'running', run_count = run_count + 1, "
        "attempt = attempt + 1, worker_id = 'w1', started_at = now() WHERE id = %s", (job_id,))
    row = job(conn, job_id)
    return ClaimedJob(
        id=job_id, queue=row["queue"], task=row["task"], args=row["args"], priority=0,
        run_at=row["run_at"], limit_key=None, run_count=row["run_count"],
        attempt=row["attempt"], max_attempts=row["max_attempts"], worker_id="w1",
    )


async def test_a_stale_finish_is_discarded_and_the_live_one_is_kept(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = insert_job(conn, "t")
    stale = running(conn, job_id)
    # The job is rescued and claimed again: run_count moves on.
    conn.execute("UPDATE akadze.jobs SET state = 'queued' WHERE id = %s", (job_id,))
    live = running(conn, job_id)
    assert live.run_count == stale.run_count + 1

    accepted = await write(aconn, [outcomes.Finish(
        stale, outcomes.SUCCEEDED, JobState.SUCCEEDED, result='"stale"')])
    assert accepted == set()
    assert job(conn, job_id)["state"] == "running"

    accepted = await write(aconn, [outcomes.Finish(
        live, outcomes.SUCCEEDED, JobState.SUCCEEDED, result='"live"')])
    assert accepted == {job_id}
    row = job(conn, job_id)
    assert (row["state"], row["result"]) == ("succeeded", "live")

    # A repeat of the same finish (a retried write) changes nothing.
    assert await write(aconn, [outcomes.Finish(
        live, outcomes.FAILED, JobState.FAILED)]) == set()
    assert job(conn, job_id)["state"] == "succeeded"


async def test_one_statement_writes_every_kind_of_finish(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    ids = [insert_job(conn, "t") for _ in range(5)]
    before = {i: job(conn, i)["run_at"] for i in ids}
    jobs = [running(conn, i) for i in ids]
    error = outcomes.error_entry(jobs[1], AT, "ValueError", "bad")
    batch = [
        outcomes.Finish(jobs[0], outcomes.SUCCEEDED, JobState.SUCCEEDED, result="[1]"),
        outcomes.Finish(jobs[1], outcomes.RETRIED, JobState.QUEUED, delay=60.0, error=error),
        outcomes.Finish(jobs[2], outcomes.SNOOZED, JobState.QUEUED, attempt_delta=-1,
                        delay=0.0),
        outcomes.given_back(jobs[3]),
        outcomes.Finish(jobs[4], outcomes.CANCELLED, JobState.CANCELLED),
    ]
    assert await write(aconn, batch) == set(ids)
    rows = [job(conn, i) for i in ids]
    assert [r["state"] for r in rows] == ["succeeded", "queued", "queued", "queued", "cancelled"]
    assert [r["attempt"] for r in rows] == [1, 1, 0, 0, 1]
    assert rows[0]["result"] == [1] and rows[0]["finished_at"] is not None
    assert rows[1]["errors"][0]["message"] == "bad"
    assert (rows[1]["run_at"] - rows[1]["started_at"]).total_seconds() >= 59
    assert rows[3]["run_at"] == before[ids[3]]  # a give-back keeps its place
    assert all(r["worker_id"] is None for r in rows[1:4])
    assert rows[4]["finished_at"] is not None and rows[4]["worker_id"] == "w1"


def test_errors_keep_the_last_twenty_entries(conn: psycopg.Connection[Any]) -> None:
    errors: Any = []
    for n in range(1, 26):
        row = conn.execute("SELECT akadze.append_error(%s::jsonb, %s::jsonb)",
                           (json.dumps(errors), json.dumps({"attempt": n}))).fetchone()
        assert row is not None
        errors = row[0]
    assert [e["attempt"] for e in errors] == list(range(6, 26))
    row = conn.execute("SELECT akadze.append_error('[1]'::jsonb, NULL)").fetchone()
    assert row is not None and row[0] == [1]


def test_the_trigger_notifies_once_per_queue_when_jobs_become_queued(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_jobs")

        def received() -> list[str]:
            return [n.payload for n in listener.notifies(timeout=0.3)]

        with conn.transaction():
            for queue in ("a", "a", "b"):
                insert_job(conn, "t", queue=queue)
        assert sorted(received()) == ["a", "b"]

        conn.execute("INSERT INTO akadze.jobs (queue, task) SELECT 'bulk', 't' "
                     "FROM generate_series(1, 500)")
        assert received() == ["bulk"]

        # A claim-like update (queued -> running) and a finish do not notify ...
        conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE queue = 'bulk'")
        conn.execute("UPDATE akadze.jobs SET state = 'succeeded' WHERE queue = 'a'")
        conn.execute("UPDATE akadze.jobs SET priority = 5 WHERE queue = 'b'")
        assert received() == []
        # ... a requeue does, once, and a rolled-back one does not.
        conn.execute("UPDATE akadze.jobs SET state = 'queued' WHERE queue = 'bulk'")
        assert received() == ["bulk"]
        with conn.transaction():
            conn.execute("UPDATE akadze.jobs SET state = 'queued' WHERE queue = 'a'")
            raise_rollback(conn)
        assert received() == []


def raise_rollback(conn: psycopg.Connection[Any]) -> None:
    raise psycopg.Rollback()
