"""The worker's opt-in signals: ``Worker(..., on_event=callback)``."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from worker_support import Events, insert_job, wait_state

from akadze import Akadze, Worker, current
from akadze.worker import EVENT_KINDS, WorkerEvent


async def test_the_events_tell_a_workers_life_in_order(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    events = Events()
    job_id = insert_job(conn, "t")
    async with Worker(app, poll_interval=60, on_event=events) as worker:
        assert "ready" in events.kinds()  # entering waits for it
        written = await events.next("outcomes_written")
        # The claim took fewer jobs than slots were free: the queue waits for work.
        await events.next("idle", queue="default", after=await events.next("claimed"))
    kinds = events.kinds()
    assert kinds[0] == "started" and kinds[-1] == "stopped"
    assert set(kinds) <= set(EVENT_KINDS)
    assert kinds.index("listening") < kinds.index("ready")  # ready: heartbeat and LISTEN tried
    claimed = events.seen[kinds.index("claimed")]
    assert (claimed.queue, claimed.job_ids) == ("default", (job_id,))
    done = events.seen[written]
    assert (done.job_ids, done.discarded) == ((job_id,), ())
    assert "lease_renewed" in kinds and "fenced" not in kinds
    stopping = events.seen[kinds.index("stopping")]
    assert stopping.detail == "graceful" and kinds.index("stopping") > written
    assert {event.worker_id for event in events.seen} == {worker.worker_id}
    assert (await wait_state(conn, job_id, "succeeded"))["state"] == "succeeded"


async def test_an_outcome_the_fence_refuses_is_reported_as_discarded(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    @app.task("overtaken")
    async def overtaken() -> str:
        # Someone else took the job meanwhile (a rescue and a new claim).
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
            await other.execute(
                "UPDATE akadze.jobs SET run_count = run_count + 1, claim_token = "
                "akadze.new_claim_token() WHERE id = %s", (current().id,))
        return "too late"

    events = Events()
    job_id = insert_job(conn, "overtaken")
    async with Worker(app, poll_interval=60, on_event=events) as worker:
        written = events.seen[await events.next("outcomes_written")]
    assert (written.job_ids, written.discarded) == ((), (job_id,))
    assert worker.counts["lost"] == 1
    row = conn.execute("SELECT state::text, result FROM akadze.jobs WHERE id = %s",
                       (job_id,)).fetchone()
    assert row == ("running", None)  # left to the run that overtook it


async def test_a_failing_callback_is_logged_and_changes_nothing(
    app: Akadze, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    @app.task("t")
    async def t() -> str:
        return "done"

    seen: list[WorkerEvent] = []

    def broken(event: WorkerEvent) -> None:
        seen.append(event)
        raise RuntimeError("observer broke")

    job_id = insert_job(conn, "t")
    async with Worker(app, poll_interval=0.05, on_event=broken) as worker:
        row = await wait_state(conn, job_id, "succeeded")
    assert row["result"] == "done" and worker.counts["succeeded"] == 1
    assert [event.kind for event in seen][-1] == "stopped"
    assert "on_event callback failed" in caplog.text and "observer broke" in caplog.text
