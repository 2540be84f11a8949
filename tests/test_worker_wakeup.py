"""Wake-up: NOTIFY makes an idle worker start a job at once; polling works without it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from worker_support import Events, eventually, insert_job, wait_state

from akadze import Akadze, Worker, pause_queue_sync, resume_queue_sync, retry_now_sync


def listeners(conn: psycopg.Connection[Any]) -> list[int]:
    return [int(r[0]) for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'akadze-worker-listen'")]


async def idle(events: Events, queue: str = "default") -> None:
    """Until the worker listens, and a claim of ``queue`` made after the wake-up of
    the listener's start has found nothing and waits (for a notification or its
    next poll)."""
    listening = await events.next("listening")
    await events.next("idle", queue=queue, after=listening)


async def test_an_idle_worker_starts_a_new_job_on_notification(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    started: list[float] = []

    @app.task("t")
    async def t() -> None:
        started.append(time.monotonic())

    # Polling every minute: only the notification can start the job quickly.
    events = Events()
    async with Worker(app, poll_interval=60, on_event=events):
        assert "listening" in events.kinds()
        delays = []
        for _ in range(5):
            committed = time.monotonic()
            job_id = insert_job(conn, "t")
            await wait_state(conn, job_id, "succeeded", within=5)
            delays.append(started[-1] - committed)
    assert max(delays) < 2.0, delays


async def test_polling_alone_picks_up_jobs_without_listen(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    async with Worker(app, listen=False, poll_interval=0.1):
        assert listeners(conn) == []
        job_id = insert_job(conn, "t")
        await wait_state(conn, job_id, "succeeded", within=5)


async def test_the_listener_comes_back_after_its_connection_is_killed(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    events = Events()
    async with Worker(app, poll_interval=60, on_event=events):
        first = await events.next("listening")
        (old,) = await eventually(lambda: listeners(conn))
        conn.execute("SELECT pg_terminate_backend(%s)", (old,))
        await events.next("listening", after=first)
        await eventually(lambda: (pids := listeners(conn)) and pids != [old])
        job_id = insert_job(conn, "t")
        await wait_state(conn, job_id, "succeeded", within=5)


async def test_a_retry_due_soon_wakes_the_worker_without_polling(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    from akadze import Retry, current

    @app.task("again")
    async def again() -> None:
        if current().attempt == 1:
            raise Retry(delay=0.3)

    job_id = insert_job(conn, "again")
    async with Worker(app, poll_interval=60, listen=False):
        row = await wait_state(conn, job_id, "succeeded", within=10)
    assert row["attempt"] == 2


async def test_resuming_a_queue_wakes_an_idle_worker(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    pause_queue_sync(conn, "default")
    job_id = insert_job(conn, "t")
    # Polling every minute: only a notification can start the job within seconds.
    events = Events()
    async with Worker(app, poll_interval=60, on_event=events):
        # A claim has found the queue paused, the worker listens, and no wake-up
        # is pending (the one of the listener's start has been served): the
        # queue waits for a notification or its next poll.
        await idle(events)
        assert conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s",
                            (job_id,)).fetchone() == ("queued",)
        assert resume_queue_sync(conn, "default")
        await wait_state(conn, job_id, "succeeded", within=5)


async def test_retry_now_wakes_an_idle_worker(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    job_id = insert_job(conn, "t", run_at=datetime.now(UTC) + timedelta(hours=1))
    events = Events()
    async with Worker(app, poll_interval=60, on_event=events):
        await idle(events)
        assert retry_now_sync(conn, job_id)
        await wait_state(conn, job_id, "succeeded", within=5)
