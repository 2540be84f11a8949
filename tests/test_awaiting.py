"""wait_for / wait_for_sync: woken by the notification of the terminal write (jobs nobody
waits for notify nothing), with a polling fallback; TimeoutError; every kind of source."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest
from worker_support import eventually, wait_state

from akadze import (
    Akadze,
    ConfigurationError,
    Fail,
    JobNotFound,
    JobState,
    MigrationError,
    Worker,
    request_cancel_sync,
    wait_for,
    wait_for_sync,
    waiters,
)


@pytest.fixture
def tasks(app: Akadze) -> dict[str, Any]:
    gate = threading.Event()

    @app.task("gated")
    def gated(n: int = 0) -> int:
        assert gate.wait(30)
        return n + 1

    @app.task("fails", max_attempts=1)
    def fails() -> None:
        raise Fail("no")

    return {"gated": gated, "fails": fails, "gate": gate}


async def test_returns_the_summary_once_the_job_succeeded(
        app: Akadze, conn: Any, tasks: dict[str, Any]) -> None:
    job_id = tasks["gated"].using().enqueue_sync(n=41)
    async with Worker(app, poll_interval=30.0):  # polling cannot wake it in time
        waiter = asyncio.create_task(wait_for(app, job_id, timeout=30, poll_interval=60))
        await asyncio.sleep(0)
        assert not waiter.done()
        tasks["gate"].set()
        summary = await asyncio.wait_for(waiter, 20)
    assert summary.state is JobState.SUCCEEDED and summary.result == 42
    awaited = conn.execute("SELECT awaited FROM akadze.jobs WHERE id = %s", (job_id,))
    assert awaited.fetchone() == (True,)


async def test_the_notification_wakes_the_waiter_not_the_poll(
        app: Akadze, conn: Any, tasks: dict[str, Any]) -> None:
    # The job is finished by hand, as a worker's outcome write would: the waiter, whose
    # poll interval is a minute, returns because the terminal commit notified it.
    job_id = tasks["gated"].using().enqueue_sync()
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = %s", (job_id,))
    waiter = asyncio.create_task(wait_for(app.database_url, job_id, timeout=30,
                                          poll_interval=60))
    with psycopg.connect(app.database_url, autocommit=True) as watcher:
        for _ in range(3000):  # the waiter has marked the job
            row = watcher.execute("SELECT awaited FROM akadze.jobs WHERE id = %s",
                                  (job_id,)).fetchone()
            if row == (True,):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the waiter never marked the job")
    other = tasks["gated"].using().enqueue_sync()
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = %s", (other,))
    conn.execute("UPDATE akadze.jobs SET awaited = true WHERE id = %s", (other,))
    # another awaited job's notification does not end the wait
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                 "WHERE id = %s", (other,))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    conn.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
                 (job_id,))
    summary = await asyncio.wait_for(waiter, 10)
    assert summary.state is JobState.FAILED and summary.id == job_id


def test_sync_twin_and_jobs_nobody_waits_for_notify_nothing(
        app: Akadze, conn: Any, tasks: dict[str, Any]) -> None:
    job_id = tasks["fails"].using().enqueue_sync()
    quiet = tasks["fails"].using().enqueue_sync()
    with psycopg.connect(app.database_url, autocommit=True) as listener:
        listener.execute("LISTEN akadze_done")

        async def run() -> None:
            # job_id is awaited before it runs, and quiet only once it has failed,
            # each seen in the database: a busy CI saw the worker end job_id before
            # the wait marked it (nothing notified), and quiet's wait mark it before
            # its outcome was written (its end notified).
            waited = asyncio.create_task(
                asyncio.to_thread(wait_for_sync, app, job_id, timeout=30))
            await eventually(lambda: conn.execute(
                "SELECT awaited FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()[0],
                what="job_id marked awaited")
            async with Worker(app):
                await waited
                await wait_state(conn, quiet, "failed")
                await asyncio.to_thread(wait_for_sync, app, quiet, timeout=30,
                                        poll_interval=0.05)

        asyncio.run(run())
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert payloads == [str(job_id)]  # quiet was awaited only after it had failed


def test_timeout_unknown_ids_and_bad_arguments(app: Akadze, tasks: dict[str, Any]) -> None:
    job_id = tasks["gated"].using().enqueue_sync()
    with pytest.raises(TimeoutError, match=f"job {job_id} is still queued"):
        wait_for_sync(app, job_id, timeout=0.2, poll_interval=0.05)
    with pytest.raises(JobNotFound):
        wait_for_sync(app, 987654, timeout=1)
    for bad in ({"timeout": -1}, {"timeout": "1"}, {"poll_interval": 0},
                {"timeout": float("nan")}):
        with pytest.raises(ConfigurationError):
            wait_for_sync(app, job_id, **bad)
    assert request_cancel_sync(app, job_id)
    assert wait_for_sync(app, job_id, timeout=1).state is JobState.CANCELLED


def test_a_connection_in_a_transaction_is_polled_without_a_lock(
        app: Akadze, conn: Any, tasks: dict[str, Any]) -> None:
    job_id = tasks["gated"].using().enqueue_sync()
    with psycopg.connect(app.database_url) as mine:  # not autocommit: a transaction
        done = threading.Event()
        found: list[Any] = []

        def waiting() -> None:
            found.append(wait_for_sync(mine, job_id, timeout=30, poll_interval=0.02))
            done.set()

        thread = threading.Thread(target=waiting)
        thread.start()
        # the caller's transaction holds no lock on the job: a write goes through
        conn.execute("UPDATE akadze.jobs SET state = 'cancelled', finished_at = now() "
                     "WHERE id = %s", (job_id,))
        assert done.wait(20)
        thread.join()
    assert found[0].state is JobState.CANCELLED
    assert conn.execute("SELECT awaited FROM akadze.jobs WHERE id = %s",
                        (job_id,)).fetchone() == (False,)


def _connections(conn: Any) -> tuple[int, int]:
    """(the shared waiters' connections, every other one but ``conn``) of this database."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE application_name = %s), "
        "count(*) FILTER (WHERE application_name <> %s AND pid <> pg_backend_pid()) "
        "FROM pg_stat_activity WHERE datname = current_database()",
        (waiters.APPLICATION_NAME, waiters.APPLICATION_NAME)).fetchone()
    return int(row[0]), int(row[1])


@pytest.mark.timeout(300)
async def test_a_thousand_waiters_of_one_process_share_one_connection(
        app: Akadze, conn: Any, tasks: dict[str, Any]) -> None:
    # 1 000 async waiters and 20 threads of wait_for_sync, all at once, on the app and
    # on its URL: one connection of the process LISTENs and marks for all of them, and
    # one statement ending every job wakes them all with terminal summaries.
    ids = tasks["gated"].using().enqueue_many_sync([{"n": n} for n in range(1000)])
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = ANY(%s)", (ids,))
    waits = [asyncio.create_task(wait_for(app if n % 2 else app.database_url, job_id,
                                          timeout=120, poll_interval=60))
             for n, job_id in enumerate(ids)]
    threads = [asyncio.create_task(asyncio.to_thread(wait_for_sync, app, job_id, timeout=120,
                                                     poll_interval=60))
               for job_id in ids[:20]]

    def all_marked() -> bool:
        row = conn.execute("SELECT count(*) FROM akadze.jobs WHERE awaited").fetchone()
        return bool(row == (1000,))

    await eventually(all_marked, within=120, what="every job marked")
    assert _connections(conn) == (1, 0)
    assert not any(w.done() for w in waits + threads)
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now(), "
                 "result = to_jsonb(id) WHERE id = ANY(%s)", (ids,))
    summaries = await asyncio.wait_for(asyncio.gather(*waits, *threads), 120)
    assert [s.id for s in summaries] == ids + ids[:20]
    assert all(s.state is JobState.SUCCEEDED and s.result == s.id for s in summaries)
    # the shared connection closes a little after its last waiter
    await eventually(lambda: _connections(conn) == (0, 0), within=30,
                     what="the shared connection closed")


async def test_the_shared_waiters_poll_and_report_errors(
        app: Akadze, conn: Any, tasks: dict[str, Any], empty_database_url: str) -> None:
    quiet, deleted, ends = tasks["gated"].using().enqueue_many_sync([{}, {}, {}])
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = ANY(%s)",
                 ([quiet, deleted, ends],))
    unnotified = asyncio.create_task(wait_for(app, quiet, timeout=60, poll_interval=0.05))
    gone = asyncio.create_task(wait_for(app, deleted, timeout=60, poll_interval=0.05))
    timed_out = asyncio.create_task(wait_for(app, ends, timeout=0.5, poll_interval=60))
    await eventually(lambda: conn.execute("SELECT count(*) FROM akadze.jobs WHERE awaited")
                     .fetchone() == (3,), what="the jobs marked")
    # no trigger fires in replica mode: no notification, the poll finds the end
    conn.execute("SET session_replication_role = replica")
    conn.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
                 (quiet,))
    conn.execute("RESET session_replication_role")
    conn.execute("DELETE FROM akadze.jobs WHERE id = %s", (deleted,))
    assert (await asyncio.wait_for(unnotified, 30)).state is JobState.FAILED
    with pytest.raises(JobNotFound, match="deleted while awaited"):
        await asyncio.wait_for(gone, 30)
    with pytest.raises(TimeoutError, match=f"job {ends} is still running after 0.5 s"):
        await timed_out
    with pytest.raises(MigrationError):  # the error of the shared connection, not a hang
        await asyncio.wait_for(wait_for(empty_database_url, 1, timeout=30), 30)
    with pytest.raises(ConfigurationError, match="connect"):
        await asyncio.wait_for(wait_for("postgresql://postgres@127.0.0.1:1/none", 1,
                                        timeout=30), 30)


async def test_the_shared_connection_closes_soon_after_its_last_waiter_left(
        app: Akadze, conn: Any, tasks: dict[str, Any]) -> None:
    # The last waiter times out while the connection sleeps towards a poll a minute
    # away: it is closed a linger after that waiter left, not at the poll.
    job_id = tasks["gated"].using().enqueue_sync()
    with pytest.raises(TimeoutError):
        await wait_for(app, job_id, timeout=0.5, poll_interval=60)
    await eventually(lambda: _connections(conn) == (0, 0), within=waiters.LINGER * 5,
                     what="the shared connection closed")
