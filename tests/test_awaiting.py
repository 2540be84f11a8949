"""wait_for / wait_for_sync: woken by the notification of the terminal write (jobs nobody
waits for notify nothing), with a polling fallback; TimeoutError; every kind of source."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

from akadze import (
    Akadze,
    ConfigurationError,
    Fail,
    JobNotFound,
    JobState,
    Worker,
    request_cancel_sync,
    wait_for,
    wait_for_sync,
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
            async with Worker(app):
                await asyncio.to_thread(wait_for_sync, app, job_id, timeout=30)
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
