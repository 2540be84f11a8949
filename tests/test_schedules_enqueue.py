"""enqueue_due against a real database: exactly once across racing processes, the
grace window, overlap=False."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.schedules import enqueue_due, enqueue_due_sync

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def make_app(database_url: str, schedules: int = 12) -> Akadze:
    app = Akadze(database_url=database_url)

    @app.task("tick", queue="periodic")
    def tick(n: int = 0) -> None:
        return None

    for number in range(schedules):
        app.add_schedule(f"s{number}", task="tick", every=timedelta(minutes=1),
                         args={"n": number})
    return app


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    jobs = conn.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    fires = conn.execute("SELECT count(*) FROM akadze.periodic_fires").fetchone()
    linked = conn.execute(
        "SELECT count(*) FROM akadze.periodic_fires f JOIN akadze.jobs j ON j.id = f.job_id"
    ).fetchone()
    assert jobs and fires and linked
    return int(jobs[0]), int(fires[0]), int(linked[0])


def test_threads_racing_enqueue_each_fire_once(database_url: str,
                                               conn: psycopg.Connection[Any]) -> None:
    app = make_app(database_url)
    racers = 6
    rounds = 5
    results: list[list[int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(racers)
    errors: list[BaseException] = []

    def race() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as mine:
                for round_number in range(rounds):
                    now = T0 + timedelta(minutes=round_number, seconds=5)
                    barrier.wait(timeout=30)
                    ids = enqueue_due_sync(mine, app, now)
                    with lock:
                        results.append(ids)
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    every_id = [job_id for ids in results for job_id in ids]
    assert len(every_id) == len(set(every_id)) == 12 * rounds
    assert counts(conn) == (12 * rounds, 12 * rounds, 12 * rounds)
    rows = conn.execute(
        "SELECT j.args->>'n', j.meta->>'schedule', j.queue FROM akadze.periodic_fires f "
        "JOIN akadze.jobs j ON j.id = f.job_id WHERE f.schedule = 's3'"
    ).fetchall()
    assert rows == [("3", "s3", "periodic")] * rounds


async def test_async_connections_racing(database_url: str,
                                        conn: psycopg.Connection[Any]) -> None:
    app = make_app(database_url, schedules=8)
    connections = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
                   for _ in range(5)]
    try:
        now = T0 + timedelta(seconds=1)
        results = await asyncio.gather(*(enqueue_due(c, app, now) for c in connections))
        again = await asyncio.gather(*(enqueue_due(c, app, now) for c in connections))
    finally:
        for c in connections:
            await c.close()
    assert sorted(job_id for ids in results for job_id in ids) == sorted(
        {job_id for ids in results for job_id in ids})
    assert sum(len(ids) for ids in results) == 8
    assert all(ids == [] for ids in again)
    assert counts(conn) == (8, 8, 8)


def test_grace_window_and_latest_fire_only(database_url: str,
                                           conn: psycopg.Connection[Any]) -> None:
    app = Akadze(database_url=database_url)

    @app.periodic("hourly", cron="0 * * * *", grace=timedelta(minutes=10))
    def hourly() -> None:
        return None

    # Ten minutes and one second late: skipped.
    assert enqueue_due_sync(conn, app, T0 + timedelta(minutes=10, seconds=1)) == []
    # After a downtime of five hours, only the latest fire runs (within its grace).
    down = T0 + timedelta(hours=5, minutes=3)
    [job_id] = enqueue_due_sync(conn, app, down)
    fire = conn.execute(
        "SELECT fire_at FROM akadze.periodic_fires WHERE job_id = %s", (job_id,)
    ).fetchone()
    assert fire == (T0 + timedelta(hours=5),)
    assert enqueue_due_sync(conn, app, down + timedelta(minutes=1)) == []
    assert counts(conn) == (1, 1, 1)


def test_overlap_false_skips_while_previous_run_is_active(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    app = Akadze(database_url=database_url)

    @app.periodic("sync", every=timedelta(minutes=5), overlap=False)
    def sync() -> None:
        return None

    [first] = enqueue_due_sync(conn, app, T0 + timedelta(seconds=1))
    # The first job is still queued: the next fire is recorded and skipped.
    assert enqueue_due_sync(conn, app, T0 + timedelta(minutes=5, seconds=1)) == []
    skipped = conn.execute(
        "SELECT job_id FROM akadze.periodic_fires WHERE fire_at = %s",
        (T0 + timedelta(minutes=5),),
    ).fetchone()
    assert skipped == (None,)
    # Running still counts as active.
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = %s", (first,))
    assert enqueue_due_sync(conn, app, T0 + timedelta(minutes=10, seconds=1)) == []
    # Once it finished, the next fire runs.
    conn.execute(
        "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s",
        (first,),
    )
    assert len(enqueue_due_sync(conn, app, T0 + timedelta(minutes=15, seconds=1))) == 1


async def test_overlap_false_async_and_overlap_true(database_url: str,
                                                    aconn: psycopg.AsyncConnection[Any]) -> None:
    app = Akadze(database_url=database_url)

    @app.periodic("strict", every=60, overlap=False)
    def strict() -> None:
        return None

    @app.periodic("loose", every=60)
    def loose() -> None:
        return None

    assert len(await enqueue_due(aconn, app, T0)) == 2
    later = await enqueue_due(aconn, app, T0 + timedelta(minutes=1))
    assert len(later) == 1  # only "loose": "strict" still has a queued job
    cur = await aconn.execute("SELECT task FROM akadze.jobs WHERE id = %s", (later[0],))
    assert await cur.fetchone() == ("loose",)


@pytest.fixture(params=["enqueue_due", "enqueue_due_sync"])
async def tick(request: pytest.FixtureRequest, database_url: str) -> Any:
    """enqueue_due or its sync twin, on an autocommit connection of its flavour: the
    tests that take it run both through the same cases."""
    if request.param == "enqueue_due_sync":
        with psycopg.connect(database_url, autocommit=True) as mine:

            async def sync_tick(app: Akadze, now: datetime) -> list[int]:
                return enqueue_due_sync(mine, app, now)

            yield sync_tick
        return
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as amine:

        async def async_tick(app: Akadze, now: datetime) -> list[int]:
            return await enqueue_due(amine, app, now)

        yield async_tick


async def test_a_failing_fire_is_logged_left_unrecorded_and_the_others_go_on(
    database_url: str, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture,
    tick: Any,
) -> None:
    app = Akadze(database_url=database_url)
    refused: list[str] = []

    @app.on_enqueue
    def refuse_once(hook_conn: Any, job: Any) -> None:
        if job.task == "bad" and not refused:
            refused.append(job.task)
            raise RuntimeError("refused by hook")

    @app.periodic("bad", every=60)
    def bad() -> None:
        return None

    @app.periodic("good", every=60)
    def good() -> None:
        return None

    ids = await tick(app, T0)
    assert len(ids) == 1 and refused == ["bad"]
    assert "schedule 'bad': could not enqueue the fire of" in caplog.text
    # The failed fire is not recorded: only the good schedule's job and fire exist.
    assert counts(conn) == (1, 1, 1)
    # The next pass (still within the grace) enqueues it.
    assert len(await tick(app, T0 + timedelta(seconds=30))) == 1
    assert counts(conn) == (2, 2, 2)


async def test_a_database_error_in_a_fire_stops_the_pass(
    database_url: str, conn: psycopg.Connection[Any], tick: Any,
) -> None:
    app = Akadze(database_url=database_url)

    @app.on_enqueue
    def broken(hook_conn: Any, job: Any) -> Any:
        return hook_conn.execute("SELECT 1/0")  # awaited on the async path

    @app.periodic("first", every=60)
    def first() -> None:
        return None

    with pytest.raises(psycopg.errors.DivisionByZero):
        await tick(app, T0)
    assert counts(conn) == (0, 0, 0)


async def test_cron_schedule_in_a_zone(database_url: str,
                                       aconn: psycopg.AsyncConnection[Any]) -> None:
    app = Akadze(database_url=database_url)

    @app.periodic("berlin", cron="30 2 * * *", timezone="Europe/Berlin")
    def berlin() -> None:
        return None

    # 2024-03-31 02:30 does not exist in Berlin: the fire is at 03:30 CEST = 01:30 UTC.
    assert await enqueue_due(aconn, app, datetime(2024, 3, 31, 1, 29, tzinfo=UTC)) == []
    assert len(await enqueue_due(aconn, app, datetime(2024, 3, 31, 1, 30, tzinfo=UTC))) == 1
    cur = await aconn.execute("SELECT fire_at FROM akadze.periodic_fires")
    assert await cur.fetchall() == [(datetime(2024, 3, 31, 1, 30, tzinfo=UTC),)]
