"""Hooks (before_run, after_run, on_transition) and complete_tx()."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from worker_support import eventually, insert_job, job, wait_state

from akadze import Akadze, JobLost, Worker, current


@pytest.fixture
def notes(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE notes (job_id bigint, note text)")
    return conn


async def test_hooks_run_in_order_and_transitions_in_the_changing_transaction(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    order: list[str] = []
    seen_state: list[str] = []

    @app.before_run
    def before(job: Any) -> None:
        order.append(f"before {job.id}")

    @app.after_run
    async def after(job: Any) -> None:
        order.append(f"after {job.id} {current().outcome}")

    @app.on_transition
    async def transition(db: psycopg.AsyncConnection[Any], job: Any, old: str, new: str) -> None:
        order.append(f"{old}->{new}")
        cur = await db.execute("SELECT state::text FROM akadze.jobs WHERE id = %s", (job.id,))
        row = await cur.fetchone()
        assert row is not None
        seen_state.append(row[0])

    @app.task("t")
    async def t() -> None:
        order.append("run")

    job_id = insert_job(conn, "t")
    async with Worker(app, poll_interval=0.05):
        await wait_state(conn, job_id, "succeeded")
        await eventually(lambda: "running->succeeded" in order)
    assert order.index("queued->running") < order.index(f"before {job_id}")
    assert order.index(f"before {job_id}") < order.index("run")
    assert order.index("run") < order.index(f"after {job_id} succeeded")
    assert order.index("run") < order.index("running->succeeded")
    # Each hook saw the row already changed, inside the transaction that changed it.
    assert seen_state == ["running", "succeeded"]


async def test_a_failing_transition_hook_is_logged_and_its_writes_rolled_back(
    app: Akadze, notes: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    @app.on_transition
    async def bad(db: psycopg.AsyncConnection[Any], job: Any, old: str, new: str) -> None:
        if new == "succeeded":
            await db.execute("INSERT INTO notes VALUES (%s, 'from hook')", (job.id,))
            raise RuntimeError("hook broke")

    @app.task("t")
    async def t() -> None:
        return None

    job_id = insert_job(notes, "t")
    async with Worker(app, poll_interval=0.05):
        await wait_state(notes, job_id, "succeeded")
    assert notes.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    assert "hook broke" in caplog.text


async def test_complete_tx_commits_the_tasks_writes_with_the_success(
    app: Akadze, notes: psycopg.Connection[Any]
) -> None:
    @app.task("async_writer")
    async def async_writer() -> None:
        async with current().complete_tx(result={"ok": True}) as db:
            await db.execute("INSERT INTO notes VALUES (%s, 'async')", (current().id,))
            cur = await db.execute("SELECT state::text FROM akadze.jobs WHERE id = %s",
                                   (current().id,))
            assert await cur.fetchone() == ("running",)

    @app.task("sync_writer")
    def sync_writer() -> None:
        with current().complete_tx(result=[1]) as db:
            db.execute("INSERT INTO notes VALUES (%s, 'sync')", (current().id,))

    first = insert_job(notes, "async_writer")
    second = insert_job(notes, "sync_writer")
    async with Worker(app, poll_interval=0.05) as worker:
        a = await wait_state(notes, first, "succeeded")
        b = await wait_state(notes, second, "succeeded")
    assert (a["result"], b["result"]) == ({"ok": True}, [1])
    rows = notes.execute("SELECT job_id, note FROM notes ORDER BY job_id").fetchall()
    assert rows == [(first, "async"), (second, "sync")]
    assert worker.counts["succeeded"] == 2 and worker.counts["lost"] == 0


async def test_complete_tx_rolls_back_everything_when_the_fence_fails(
    app: Akadze, notes: psycopg.Connection[Any], database_url: str
) -> None:
    learned: list[str] = []

    @app.task("loser")
    async def loser() -> None:
        # Someone else took the job meanwhile (a rescue and a new claim).
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
            await other.execute(
                "UPDATE akadze.jobs SET run_count = run_count + 1, claim_token = "
                "akadze.new_claim_token() WHERE id = %s", (current().id,))
        try:
            async with current().complete_tx() as db:
                await db.execute("INSERT INTO notes VALUES (%s, 'must vanish')", (current().id,))
        except JobLost as exc:
            learned.append(str(exc))
            raise

    job_id = insert_job(notes, "loser")
    async with Worker(app, poll_interval=0.05) as worker:
        await eventually(lambda: learned)
        await eventually(lambda: worker.running == 0)
    assert notes.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    row = job(notes, job_id)
    assert row["state"] == "running" and row["run_count"] == 2  # left to its new owner
    assert worker.counts["lost"] == 1 and "no longer this run's" in learned[0]


async def test_before_run_failing_counts_as_an_error(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.before_run
    def refuse(job: Any) -> None:
        raise PermissionError("not today")

    ran: list[int] = []

    @app.task("t")
    async def t() -> None:
        ran.append(1)

    job_id = insert_job(conn, "t", max_attempts=1)
    async with Worker(app, poll_interval=0.05):
        row = await wait_state(conn, job_id, "failed")
    assert ran == [] and row["errors"][0]["error"] == "PermissionError"
