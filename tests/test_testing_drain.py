"""akadze.testing: drain() and assert_enqueued()."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from worker_support import insert_job, job

from akadze import Akadze, Fail, Retry, Snooze, current
from akadze.errors import UnknownTask
from akadze.testing import assert_enqueued, assert_enqueued_sync, drain


async def test_drain_runs_every_ready_job_and_counts_the_outcomes(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("ok")
    async def ok(n: int) -> int:
        return n

    @app.task("plain")
    def plain() -> str:
        return "thread"

    @app.task("bad")
    async def bad() -> None:
        raise Fail("no")

    @app.task("later")
    async def later() -> None:
        raise Retry(delay=3600)

    @app.task("nap", queue="naps")
    async def nap() -> None:
        if current().run_count == 1:
            raise Snooze(0)

    ids = [insert_job(conn, "ok", {"n": n}) for n in range(25)]
    insert_job(conn, "plain")
    insert_job(conn, "bad")
    delayed = insert_job(conn, "later")
    insert_job(conn, "nap", queue="naps")
    elsewhere = insert_job(conn, "ok", {"n": 99}, queue="special")
    counts = await drain(app, slots=4)
    assert counts == {"succeeded": 28, "retried": 1, "snoozed": 1, "failed": 1,
                      "cancelled": 0, "given_back": 0}
    assert all(job(conn, i)["state"] == "succeeded" for i in ids)
    assert job(conn, elsewhere)["state"] == "succeeded"
    assert job(conn, delayed)["state"] == "queued"  # due in an hour: left alone
    assert await drain(app) == {"succeeded": 0, "retried": 0, "snoozed": 0, "failed": 0,
                                "cancelled": 0, "given_back": 0}
    assert conn.execute("SELECT count(*) FROM akadze.workers").fetchone() == (0,)


async def test_assert_enqueued_matches_on_a_subset_of_the_arguments(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    @app.task("send")
    async def send(to: str, subject: str, tags: list[str]) -> None:
        return None

    first = insert_job(conn, "send", {"to": "a@x", "subject": "hi", "tags": ["x", "y"]})
    assert await assert_enqueued(app, "send", to="a@x") == [first]
    assert assert_enqueued_sync(app, "send", to="a@x", subject="hi") == [first]
    with pytest.raises(AssertionError, match=r"no job of task 'send'.*a@x"):
        await assert_enqueued(app, "send", to="b@x")
    with pytest.raises(UnknownTask):
        await assert_enqueued(app, "sned", to="a@x")
