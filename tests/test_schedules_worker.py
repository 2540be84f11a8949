"""Schedules inside real workers: two workers with maintenance on, a manual clock; each
fire runs once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from akadze import Akadze, Worker
from akadze.clock import ManualClock


async def wait_for(conn: psycopg.AsyncConnection[Any], sql: str, expected: Any,
                   within: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        row = await (await conn.execute(sql)).fetchone()
        if row is not None and row[0] == expected:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{sql!r} gave {row}"
        await asyncio.sleep(0.05)  # polling database state with a deadline


async def test_two_workers_run_each_fire_once(database_url: str,
                                              aconn: psycopg.AsyncConnection[Any]) -> None:
    await _two_workers_run_each_fire_once(database_url, aconn)


async def test_each_fire_runs_once_through_pgbouncer(
    pgbouncer_url: str, aconn: psycopg.AsyncConnection[Any]
) -> None:
    # Maintenance (its lock), schedules (their per-schedule locks) and claims through
    # a pooler in transaction mode; aconn is direct.
    await _two_workers_run_each_fire_once(pgbouncer_url, aconn, transaction_pooling=True)


async def _two_workers_run_each_fire_once(url: str, aconn: psycopg.AsyncConnection[Any],
                                          transaction_pooling: bool = False) -> None:
    clock = ManualClock(datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC))
    app = Akadze(database_url=url, clock=clock)
    runs: list[str] = []

    @app.periodic("minutely", every=timedelta(minutes=1), queue="cron")
    def minutely() -> None:
        runs.append("run")

    workers = [Worker(app, database_url=url, poll_interval=0.05,
                      transaction_pooling=transaction_pooling) for _ in range(2)]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        done = "SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'"
        await wait_for(aconn, done, 1)
        clock.advance(timedelta(minutes=1))
        await wait_for(aconn, done, 2)
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)
    cur = await aconn.execute("SELECT count(*), count(DISTINCT fire_at) FROM "
                              "akadze.periodic_fires JOIN akadze.jobs ON jobs.id = job_id")
    assert await cur.fetchone() == (2, 2)
    assert runs == ["run", "run"]
