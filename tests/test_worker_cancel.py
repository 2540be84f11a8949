"""Cancellation of queued and running jobs (async and plain), with and without LISTEN."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest
from worker_support import insert_job, job, wait_event, wait_state

from akadze import Akadze, Worker, current, request_cancel, request_cancel_sync
from akadze.errors import JobNotFound


async def test_a_queued_job_is_cancelled_directly_and_never_runs(
    app: Akadze, conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    ran = []
    transitions: list[tuple[str, str]] = []

    @app.task("t")
    async def t() -> None:
        ran.append(1)

    @app.on_transition
    def record(conn: Any, job: Any, old: str, new: str) -> None:
        transitions.append((old, new))

    job_id = insert_job(conn, "t")
    async with aconn.transaction():
        assert await request_cancel(aconn, job_id, app=app) is True
    row = job(conn, job_id)
    assert row["state"] == "cancelled" and row["finished_at"] is not None
    assert transitions == [("queued", "cancelled")]
    # Finished jobs are left alone.
    assert await request_cancel(app, job_id) is False
    async with Worker(app, poll_interval=0.05) as worker:
        other = insert_job(conn, "t")
        await wait_state(conn, other, "succeeded")
    assert ran == [1] and worker.counts["succeeded"] == 1


async def test_a_cancel_joins_the_callers_transaction(
    app: Akadze, conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    job_id = insert_job(conn, "t")
    async with aconn.transaction(force_rollback=True):
        assert await request_cancel(aconn, job_id)
    assert job(conn, job_id)["state"] == "queued"
    with pytest.raises(JobNotFound):
        await request_cancel(aconn, 999_999)


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "poll"])
async def test_a_running_async_job_is_interrupted_and_ends_cancelled(
    app: Akadze, conn: psycopg.Connection[Any], listen: bool
) -> None:
    started = asyncio.Event()
    interrupted = asyncio.Event()

    @app.task("long")
    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    job_id = insert_job(conn, "long")
    async with Worker(app, listen=listen, poll_interval=0.1 if not listen else 30) as worker:
        await wait_event(started)
        assert request_cancel_sync(conn, job_id) is True
        await wait_event(interrupted, 5)
        row = await wait_state(conn, job_id, "cancelled")
    assert row["attempt"] == 1 and row["errors"][-1]["error"] == "Cancelled"
    assert worker.counts["cancelled"] == 1


async def test_a_running_plain_job_is_told_and_its_result_dropped(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    started = threading.Event()
    finished = threading.Event()
    noticed: list[bool] = []

    @app.task("loop")
    def loop() -> str:
        started.set()
        run = current()
        for _ in range(1000):
            if run.cancel_requested:
                noticed.append(True)
                break
            threading.Event().wait(0.01)
        finished.set()
        return "result that must be dropped"

    job_id = insert_job(conn, "loop")
    async with Worker(app, poll_interval=30) as worker:
        await wait_event(started)
        request_cancel_sync(app, job_id)
        row = await wait_state(conn, job_id, "cancelled")
        await wait_event(finished)
    assert noticed == [True]
    assert row["result"] is None and job(conn, job_id)["state"] == "cancelled"
    assert worker.counts["cancelled"] == 1 and worker.counts["succeeded"] == 0
