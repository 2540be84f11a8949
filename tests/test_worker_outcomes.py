"""Every way a run can end, through a real worker on a real database."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from worker_support import eventually, insert_job, job, wait_state

from akadze import Akadze, Cancel, Fail, Retry, Snooze, Worker, current

FAST = {"poll_interval": 0.05}


async def test_success_stores_the_result_and_current_describes_the_run(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    seen: dict[str, Any] = {}

    @app.task("ok")
    async def ok(n: int) -> dict[str, int]:
        run = current()
        seen.update(id=run.id, attempt=run.attempt, run_count=run.run_count, meta=run.meta,
                    task=run.task, cancel=run.cancel_requested)
        return {"double": n * 2}

    job_id = insert_job(conn, "ok", {"n": 21}, meta={"tenant": "acme"})
    async with Worker(app, **FAST) as worker:
        row = await wait_state(conn, job_id, "succeeded")
    assert row["result"] == {"double": 42}
    assert row["attempt"] == 1 and row["finished_at"] is not None and row["errors"] == []
    assert seen == {"id": job_id, "attempt": 1, "run_count": 1, "meta": {"tenant": "acme"},
                    "task": "ok", "cancel": False}
    assert worker.counts["succeeded"] == 1


async def test_a_plain_function_runs_in_a_worker_thread(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    threads: list[str] = []

    @app.task("plain")
    def plain(n: int) -> int:
        threads.append(threading.current_thread().name)
        assert current().attempt == 1
        return n + 1

    job_id = insert_job(conn, "plain", {"n": 1})
    async with Worker(app, **FAST):
        row = await wait_state(conn, job_id, "succeeded")
    assert row["result"] == 2
    assert threads and threads[0].startswith("akadze-task")


async def test_retry_spends_an_attempt_and_snooze_does_not(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("retry_once")
    async def retry_once() -> str:
        if current().attempt == 1:
            raise Retry(delay=0)
        return "done"

    @app.task("snooze_once")
    async def snooze_once() -> str:
        if current().run_count == 1:
            raise Snooze(0)
        return "done"

    retried = insert_job(conn, "retry_once")
    snoozed = insert_job(conn, "snooze_once")
    async with Worker(app, **FAST):
        first = await wait_state(conn, retried, "succeeded")
        second = await wait_state(conn, snoozed, "succeeded")
    assert (first["attempt"], first["run_count"]) == (2, 2)
    assert [e["error"] for e in first["errors"]] == ["Retry"]
    assert (second["attempt"], second["run_count"]) == (1, 2)
    assert second["errors"] == []


async def test_a_snooze_delays_the_next_run(app: Akadze, conn: psycopg.Connection[Any]) -> None:
    @app.task("later")
    async def later() -> None:
        raise Snooze(timedelta(hours=1))

    job_id = insert_job(conn, "later", max_attempts=1)
    async with Worker(app, **FAST):
        row = await eventually(lambda: (r := job(conn, job_id))["run_count"] == 1
                               and r["state"] == "queued" and r)
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert timedelta(minutes=59) < row["run_at"] - now <= timedelta(hours=1)
    assert row["attempt"] == 0 and row["worker_id"] is None


async def test_fail_and_cancel_end_the_job_at_once(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("give_up")
    async def give_up() -> None:
        raise Fail("the input is wrong")

    @app.task("drop")
    def drop() -> None:
        raise Cancel("nothing to do")

    failed = insert_job(conn, "give_up", max_attempts=5)
    cancelled = insert_job(conn, "drop")
    async with Worker(app, **FAST):
        f = await wait_state(conn, failed, "failed")
        c = await wait_state(conn, cancelled, "cancelled")
    assert f["attempt"] == 1 and f["errors"][0]["message"] == "the input is wrong"
    assert f["finished_at"] is not None
    assert c["errors"][0]["error"] == "Cancel" and c["finished_at"] is not None


async def test_errors_retry_with_the_backoff_until_attempts_run_out(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    runs: list[int] = []

    @app.task("flaky", backoff=lambda attempt: timedelta(0))
    async def flaky() -> None:
        runs.append(current().attempt)
        raise ConnectionError("no route to postgresql://app:s3cret@db.internal/app")

    job_id = insert_job(conn, "flaky", max_attempts=3)
    async with Worker(app, **FAST):
        row = await wait_state(conn, job_id, "failed")
    assert runs == [1, 2, 3]
    assert row["attempt"] == 3 and row["finished_at"] is not None
    assert [e["attempt"] for e in row["errors"]] == [1, 2, 3]
    assert all(e["error"] == "ConnectionError" for e in row["errors"])
    assert "s3cret" not in str(row["errors"]) and "***" in row["errors"][0]["message"]


async def test_the_default_backoff_is_between_half_and_all_of_two_to_the_attempt(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("boom")
    async def boom() -> None:
        raise RuntimeError("boom")

    job_id = insert_job(conn, "boom", max_attempts=3)
    before = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    async with Worker(app, **FAST):
        row = await eventually(lambda: (r := job(conn, job_id))["attempt"] == 1
                               and r["state"] == "queued" and r)
    after = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert before + timedelta(seconds=0.5) <= row["run_at"] <= after + timedelta(seconds=1)
    assert row["errors"][0]["message"] == "boom" and "traceback" in row["errors"][0]


async def test_an_async_task_over_its_timeout_is_cancelled(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    interrupted = asyncio.Event()

    @app.task("slow", timeout=0.1)
    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.set()
            raise

    job_id = insert_job(conn, "slow", max_attempts=1)
    async with Worker(app, **FAST):
        row = await wait_state(conn, job_id, "failed")
    assert interrupted.is_set()
    assert row["errors"][0]["error"] == "TimeoutError"


async def test_a_plain_task_over_its_timeout_ends_and_its_late_result_is_dropped(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    release = threading.Event()
    returned = threading.Event()
    told: list[bool] = []

    @app.task("stuck", timeout=0.1)
    def stuck() -> str:
        release.wait(30)
        told.append(current().should_stop)
        returned.set()
        return "too late"

    job_id = insert_job(conn, "stuck", max_attempts=1)
    async with Worker(app, **FAST) as worker:
        row = await wait_state(conn, job_id, "failed")
        assert worker.running == 1  # the thread still holds its slot
        release.set()
        await asyncio.to_thread(returned.wait, 10)
        await eventually(lambda: worker.running == 0)
    assert row["errors"][0]["error"] == "TimeoutError"
    final = job(conn, job_id)
    assert final["state"] == "failed" and final["result"] is None
    assert told == [True]


async def test_a_result_that_is_not_json_is_an_error(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("weird")
    async def weird() -> object:
        return {"when": datetime.now(UTC)}

    job_id = insert_job(conn, "weird", max_attempts=1)
    async with Worker(app, **FAST):
        row = await wait_state(conn, job_id, "failed")
    assert row["errors"][0]["error"] == "TypeError"
    assert "not JSON" in row["errors"][0]["message"]


async def test_stored_arguments_are_validated_again_before_the_run(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    ran = []

    @app.task("typed")
    async def typed(n: int) -> None:
        ran.append(n)

    job_id = insert_job(conn, "typed", {"n": "not a number", "extra": 1}, max_attempts=5)
    async with Worker(app, **FAST):
        row = await wait_state(conn, job_id, "failed")
    assert ran == []
    entry = row["errors"][0]
    assert entry["error"] == "InvalidArguments"
    assert "'n'" in entry["message"] and "extra" in entry["message"]
    assert row["attempt"] == 1


async def test_a_job_not_started_before_it_expires_ends_cancelled(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    ran = []

    @app.task("fresh")
    async def fresh() -> None:
        ran.append(1)

    expired = insert_job(conn, "fresh", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    valid = insert_job(conn, "fresh", expires_at=datetime.now(UTC) + timedelta(hours=1))
    async with Worker(app, **FAST):
        await wait_state(conn, expired, "cancelled")
        await wait_state(conn, valid, "succeeded")
    assert ran == [1]


async def test_a_worker_claims_only_the_tasks_it_registered(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    @app.task("mine")
    async def mine() -> None:
        return None

    other = insert_job(conn, "someone_elses")
    ours = insert_job(conn, "mine")
    async with Worker(app, **FAST):
        await wait_state(conn, ours, "succeeded")
    assert job(conn, other)["state"] == "queued"


def test_worker_settings_are_checked(app: Akadze) -> None:
    from akadze.errors import ConfigurationError, EnqueueError

    with pytest.raises(ConfigurationError, match="no tasks"):
        Worker(app)

    @app.task("t")
    async def t() -> None:
        return None

    with pytest.raises(ConfigurationError, match="slots"):
        Worker(app, slots=0)
    with pytest.raises(ConfigurationError, match="queues"):
        Worker(app, queues=[])
    # A task name the app does not have is a configuration mistake, not an enqueue one.
    with pytest.raises(ConfigurationError, match="no task named 'nope'") as refused:
        Worker(app, tasks=["t", "nope"])
    assert not isinstance(refused.value, EnqueueError)
    with pytest.raises(ConfigurationError, match="collection of task names"):
        Worker(app, tasks="t")
    with pytest.raises(ConfigurationError, match="on_event"):
        Worker(app, on_event="print")  # type: ignore[arg-type]
    assert Worker(app).queues == ["default"]


async def test_an_injected_clock_is_the_time_the_worker_claims_and_finishes_with(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    from akadze.clock import ManualClock

    @app.task("t")
    async def t() -> None:
        return None

    later = datetime.now(UTC) + timedelta(hours=2)
    job_id = insert_job(conn, "t", run_at=datetime.now(UTC) + timedelta(hours=1))
    async with Worker(app, poll_interval=0.05, clock=ManualClock(later)):
        row = await wait_state(conn, job_id, "succeeded")
    assert row["finished_at"] == later
