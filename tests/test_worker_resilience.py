"""Database trouble does not end a worker, and never makes a finished job run again."""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from typing import Any

import psycopg
import pytest
from worker_support import eventually

from akadze import Akadze, Worker, current

KILL = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE 'akadze-worker%%'")


KILL_BUSY = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             "WHERE datname = current_database() AND application_name = 'akadze-worker' "
             "AND state IN ('active', 'idle in transaction')")


def count_states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {str(r[0]): int(r[1]) for r in conn.execute(
        "SELECT state::text, count(*) FROM akadze.jobs GROUP BY state")}


async def test_killed_connections_mid_run_do_not_stop_the_worker_or_rerun_jobs(
    app: Akadze, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[int] = Counter()

    @app.task("work")
    async def work() -> None:
        runs[current().id] += 1
        await asyncio.sleep(0.01)

    total = 400
    conn.execute("INSERT INTO akadze.jobs (queue, task, max_attempts) "
                 "SELECT 'default', 'work', 1 FROM generate_series(1, %s)", (total,))
    async with Worker(app, slots=8, poll_interval=0.05) as worker:
        # Kill the worker's backends while they are busy (claims and outcome writes in
        # flight), and its LISTEN connection, a few times over.
        kills = 0
        while kills < 6:
            rows = await asyncio.to_thread(lambda: conn.execute(KILL_BUSY).fetchall())
            kills += len(rows)
            if not rows:
                await asyncio.sleep(0.001)
        conn.execute(KILL)
        await eventually(lambda: count_states(conn) == {"succeeded": total}, within=60,
                         what="every job to succeed")
        assert worker.running == 0
    assert len(runs) == total and set(runs.values()) == {1}, "a job ran twice"
    # One line per problem, not a traceback storm.
    assert "Traceback" not in caplog.text


async def test_the_worker_waits_for_a_database_that_is_not_there_yet(
    app: Akadze, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    @app.task("t")
    async def t() -> None:
        return None

    # A worker pointed at a port where nothing listens keeps trying, quietly.
    worker = Worker(app, database_url="postgresql://postgres@127.0.0.1:1/none",
                    poll_interval=0.05, lease=1)
    runner = asyncio.create_task(worker.run())
    await eventually(lambda: "heartbeat failed" in caplog.text)
    assert not runner.done()
    worker.stop()
    await asyncio.wait_for(runner, 15)
    assert caplog.text.count("heartbeat failed") == 1


@pytest.mark.slow
async def test_a_database_restart_does_not_end_the_worker(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    """Restarts the shared local server: run alone (pytest -m slow -k restart)."""
    runs: Counter[int] = Counter()

    @app.task("work")
    async def work() -> None:
        runs[current().id] += 1
        await asyncio.sleep(0.01)

    conn.execute("INSERT INTO akadze.jobs (queue, task, max_attempts) "
                 "SELECT 'default', 'work', 1 FROM generate_series(1, 200)")
    async with Worker(app, slots=4, poll_interval=0.05, lease=60):
        await eventually(lambda: len(runs) >= 20)
        await asyncio.to_thread(subprocess.run, [
            "pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart"], check=True)
        with psycopg.connect(database_url, autocommit=True) as fresh:
            await eventually(lambda: count_states(fresh) == {"succeeded": 200}, within=60)
    assert len(runs) == 200 and set(runs.values()) == {1}
