"""The claim token: a run whose claim a crash undid must never finish the job.

A claim commits asynchronously by default; a server crash (or a failover to an
asynchronous standby) can undo it after the worker started the job. The next claim
then gives the job the same ``run_count`` again. These tests undo a committed claim
the way a crash does (the row goes back to its last durable image, the one before
the claim) and claim the job again: the superseded run's writes must be refused and
the live run's accepted. Fenced on ``(id, run_count, state)`` alone, the superseded
run's writes pass.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from worker_support import Events, eventually, insert_job, job

from akadze import Akadze, Worker, current, outcomes, queries
from akadze.claim import claim
from akadze.errors import JobLost
from akadze.jobs import ClaimedJob, JobState
from akadze.worker._finishes import write

AT = datetime(2026, 1, 1, tzinfo=UTC)

# The columns a claim changes, as a crash restores them.
_CLAIMED = ("state", "run_count", "attempt", "worker_id", "started_at", "claim_token")


def image(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    """The job's row as a crash would bring it back (its last durable version)."""
    row = job(conn, job_id)
    return {name: row[name] for name in _CLAIMED}


def undo_claim(conn: psycopg.Connection[Any], job_id: int, before: dict[str, Any]) -> None:
    """Put the row back as it was before the claim, as crash recovery does with a
    commit whose WAL never reached the disk."""
    conn.execute(
        "UPDATE akadze.jobs SET state = %(state)s, run_count = %(run_count)s, "
        "attempt = %(attempt)s, worker_id = %(worker_id)s, started_at = %(started_at)s, "
        "claim_token = %(claim_token)s WHERE id = %(id)s", {**before, "id": job_id})


def claim_one(conn: psycopg.Connection[Any], worker_id: str) -> ClaimedJob:
    jobs = claim(conn, queue="default", slots=1, worker_id=worker_id)
    assert len(jobs) == 1
    return jobs[0]


def crash_and_claim_again(conn: psycopg.Connection[Any]) -> tuple[ClaimedJob, ClaimedJob]:
    """(superseded run, live run) of one job: claimed, the claim undone, claimed again."""
    job_id = insert_job(conn, "t")
    before = image(conn, job_id)
    stale = claim_one(conn, "w1")
    undo_claim(conn, job_id, before)
    live = claim_one(conn, "w2")
    assert (stale.id, stale.run_count) == (live.id, live.run_count) == (job_id, 1)
    assert stale.claim_token is not None and live.claim_token is not None
    assert stale.claim_token != live.claim_token
    return stale, live


def finish_of(kind: str, run: ClaimedJob) -> outcomes.Finish:
    if kind == "succeeded":
        return outcomes.Finish(run, outcomes.SUCCEEDED, JobState.SUCCEEDED, result='"x"')
    if kind == "retried":
        error = outcomes.error_entry(run, AT, "ValueError", "bad")
        return outcomes.Finish(run, outcomes.RETRIED, JobState.QUEUED, delay=60.0, error=error)
    if kind == "cancelled":
        return outcomes.cancelled(run, AT, "cancelled")
    assert kind == "given_back"
    return outcomes.given_back(run, AT, "stopped")


@pytest.mark.parametrize("kind", ["succeeded", "retried", "cancelled", "given_back"])
async def test_the_run_a_crash_superseded_cannot_write_its_outcome(
    kind: str, conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    stale, live = crash_and_claim_again(conn)

    assert await write(aconn, [finish_of(kind, stale)]) == set()
    row = job(conn, live.id)
    assert (row["state"], row["worker_id"], row["claim_token"]) == (
        "running", "w2", live.claim_token)
    assert row["errors"] == [] and row["result"] is None

    assert await write(aconn, [finish_of(kind, live)]) == {live.id}
    assert job(conn, live.id)["state"] != "running"


async def test_the_superseded_run_is_refused_among_live_ones_in_one_batch(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    stale, live = crash_and_claim_again(conn)
    other = insert_job(conn, "t")
    mine = claim_one(conn, "w1")
    assert mine.id == other
    batch = [finish_of("succeeded", stale), finish_of("retried", mine)]
    assert await write(aconn, batch) == {other}
    assert job(conn, live.id)["state"] == "running"


async def test_a_run_claimed_before_the_upgrade_still_finishes(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    # Claimed by an akadze without claim tokens: no token on the row nor on the run.
    job_id = insert_job(conn, "t")
    run = claim_one(conn, "w1")
    conn.execute("UPDATE akadze.jobs SET claim_token = NULL WHERE id = %s", (job_id,))
    old = ClaimedJob(**{**run.__dict__, "claim_token": None})
    # A run that carries a token never matches a row without one.
    assert await write(aconn, [finish_of("succeeded", run)]) == set()
    # The old run does, by run_count (and only its own run_count).
    newer = ClaimedJob(**{**old.__dict__, "run_count": old.run_count + 1})
    assert await write(aconn, [finish_of("succeeded", newer)]) == set()
    assert await write(aconn, [finish_of("succeeded", old)]) == {job_id}
    assert job(conn, job_id)["state"] == "succeeded"


def test_rescue_records_the_run_it_rescued_and_fences_it_out(
    conn: psycopg.Connection[Any]
) -> None:
    job_id = insert_job(conn, "t")
    run = claim_one(conn, "gone")  # a worker that never registered: an orphan
    conn.execute("UPDATE akadze.jobs SET started_at = now() - interval '1 hour' "
                 "WHERE id = %s", (job_id,))
    rescued = conn.execute(queries.get("rescue_expired"),
                           {"now": None, "orphan_grace": 1.0}).fetchall()
    assert len(rescued) == 1
    row = job(conn, job_id)
    entry = row["errors"][-1]
    assert (row["state"], row["claim_token"]) == ("queued", None)
    assert (entry["error"], entry["run_count"], entry["claim_token"]) == (
        "WorkerLost", 1, str(run.claim_token))


async def test_a_worker_whose_claim_a_crash_undid_does_not_finish_the_job(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    """The crash of issue 15, made deterministic: the worker started the job, the
    claim was undone and the job claimed again by another worker; the first worker's
    outcome (plain, and through complete_tx) must not finish the job."""
    release = asyncio.Event()
    lost: list[str] = []

    @app.task("plain")
    async def plain() -> str:
        await release.wait()
        return "superseded"

    @app.task("tx")
    async def tx() -> None:
        await release.wait()
        try:
            async with current().complete_tx("superseded") as db:
                await db.execute("SELECT 1")
        except JobLost as exc:
            lost.append(str(exc))
            raise

    ids = [insert_job(conn, "plain"), insert_job(conn, "tx")]
    before = {job_id: image(conn, job_id) for job_id in ids}
    events = Events()
    # Two slots, both busy until release: the worker has no room to claim the jobs
    # whose claims are undone, so the other claimer ("w2") takes them. That claim runs
    # off the event loop: on it, it could wait for the queue's turn held by a claim of
    # the worker that needs the loop to finish (a hang seen once).
    async with Worker(app, slots=2, poll_interval=0.05, on_event=events,
                      maintenance=False):
        await eventually(lambda: all(job(conn, i)["state"] == "running" for i in ids),
                         what="both jobs running")
        tokens = {i: job(conn, i)["claim_token"] for i in ids}
        for job_id in ids:
            undo_claim(conn, job_id, before[job_id])
        live = {j.id: j for j in await asyncio.to_thread(
            claim, conn, queue="default", slots=2, worker_id="w2")}
        assert set(live) == set(ids)
        assert all(live[i].run_count == 1 and live[i].claim_token != tokens[i] for i in ids)
        release.set()
        await events.next("outcomes_written")
    for job_id in ids:
        row = job(conn, job_id)
        assert (row["state"], row["worker_id"], row["claim_token"], row["result"]) == (
            "running", "w2", live[job_id].claim_token, None)
    assert len(lost) == 1 and f"job {ids[1]} is no longer this run's" in lost[0]
    discarded = [i for e in events.seen if e.kind == "outcomes_written" for i in e.discarded]
    assert discarded == [ids[0]]


async def test_a_worker_that_reconnects_ends_the_runs_it_lost(
    app: Akadze, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """After its connections were cut, the worker asks the database which of its runs
    are still claimed by them: the run whose claim was undone (and the job claimed
    again elsewhere) is ended at once and its outcome never written; the other run
    goes on and finishes."""
    release = asyncio.Event()
    interrupted: list[int] = []

    @app.task("t")
    async def t() -> str:
        try:
            await release.wait()
        except asyncio.CancelledError:
            interrupted.append(current().id)
            raise
        return "done"

    undone, kept = insert_job(conn, "t"), insert_job(conn, "t")
    before = image(conn, undone)
    events = Events()
    # (two busy slots and the other claim off the loop, as in the test above)
    async with Worker(app, slots=2, poll_interval=0.05, on_event=events,
                      maintenance=False):
        listening = await events.next("listening")
        await eventually(lambda: all(job(conn, i)["state"] == "running"
                                     for i in (undone, kept)), what="both jobs running")
        undo_claim(conn, undone, before)
        live = await asyncio.to_thread(claim_one, conn, "w2")
        # The connection is lost: the server ends every backend of the worker.
        # (this database's only: a suite running beside this one has workers too)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() "
                     "AND application_name LIKE 'akadze-worker%%' AND pid <> pg_backend_pid()")
        at = await events.next("lost", after=listening)
        assert events.seen[at].job_ids == (undone,)
        await eventually(lambda: interrupted == [undone], what="the lost run interrupted")
        release.set()
        await eventually(lambda: job(conn, kept)["state"] == "succeeded", what="kept done")
    row = job(conn, undone)
    assert (row["state"], row["worker_id"], row["claim_token"], row["result"]) == (
        "running", "w2", live.claim_token, None)
    lines = [r.getMessage() for r in caplog.records if f"job {undone} " in r.getMessage()
             and "lost" in r.getMessage()]
    assert len(lines) == 1 and "outcome dropped" in lines[0]
    discarded = [i for e in events.seen if e.kind == "outcomes_written" for i in e.discarded]
    assert undone not in discarded  # never even sent to the fence
