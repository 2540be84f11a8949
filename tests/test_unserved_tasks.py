"""Jobs of a task that no live worker of their queue runs do not wait in silence: the
workers warn once per queue and task, ``queues list`` and the metrics show them."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from worker_support import Events, eventually, insert_job

from akadze import Akadze, Worker, queue_snapshot_sync
from akadze.cli import main
from akadze.metrics import render_sync


def _app(url: str) -> Akadze:
    app = Akadze(database_url=url)

    @app.task("greet")
    def greet() -> None:
        return None

    @app.task("report", queue="reports")
    def report() -> None:
        return None

    return app


def _register(conn: psycopg.Connection[Any], worker_id: str, queues: list[str],
              tasks: list[str] | None, *, alive: bool = True) -> None:
    conn.execute(
        "INSERT INTO akadze.workers (id, host, pid, queues, tasks, heartbeat_at) "
        "VALUES (%s, 'h', 1, %s, %s, now() - CASE WHEN %s THEN interval '0' "
        "ELSE interval '1 hour' END)",
        (worker_id, queues, tasks, alive),
    )


def test_the_snapshot_lists_tasks_no_live_worker_of_the_queue_runs(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    for task in ("greet", "nosuch", "nosuch", "other"):
        insert_job(conn, task)
    conn.execute("UPDATE akadze.jobs SET run_at = now() + interval '1 hour' WHERE task = 'other'")
    insert_job(conn, "nosuch", queue="nobody")  # no live worker at all: the lag shows it
    _register(conn, "w1", ["default"], ["greet"])
    _register(conn, "dead", ["default"], ["nosuch"], alive=False)  # expired: not live
    [default, nobody] = queue_snapshot_sync(database_url)
    assert default.unserved == (("nosuch", 2),)  # scheduled 'other' is not ready yet
    assert nobody.unserved == ()
    assert default.to_dict()["unserved_tasks"] == {"nosuch": 2}

    # a worker of an older akadze (no task names) may run anything
    _register(conn, "old", ["default"], None)
    assert queue_snapshot_sync(database_url, "default").unserved == ()
    conn.execute("DELETE FROM akadze.workers WHERE id = 'old'")
    # another live worker of the queue runs it: served
    _register(conn, "w2", ["default", "x"], ["nosuch"])
    assert queue_snapshot_sync(database_url, "default").unserved == ()
    conn.execute("DELETE FROM akadze.workers WHERE id = 'w2'")
    # a paused queue runs nothing anyway
    conn.execute("INSERT INTO akadze.queue_pauses (queue) VALUES ('default')")
    assert queue_snapshot_sync(database_url, "default").unserved == ()
    conn.execute("DELETE FROM akadze.queue_pauses")

    metrics = render_sync(database_url)
    assert 'akadze_queue_unserved_ready_jobs{queue="default",task="nosuch"} 2' in metrics


def test_queues_list_warns_under_the_table(
    database_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    insert_job(conn, "nosuch")
    insert_job(conn, "greet", queue="lonely")
    _register(conn, "w1", ["default"], ["greet"])
    assert main(["queues", "list", "--database-url", database_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        "warning: queue default: 1 ready job of task 'nosuch', which no live worker of the "
        "queue runs",
        "note: queue lonely: 1 ready job and no live worker serves it",
    ]


async def test_a_worker_warns_once_per_queue_and_task(
    database_url: str, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    app = _app(database_url)
    insert_job(conn, "nosuch")
    insert_job(conn, "nosuch")
    insert_job(conn, "gone", queue="reports")
    insert_job(conn, "greet")
    caplog.set_level(logging.WARNING, logger="akadze.worker")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "no live worker" in r.getMessage()]

    events = Events()
    # a heartbeat every 0.1 s; each one looks at the head of the queues again
    async with Worker(app, poll_interval=0.05, lease=0.3, on_event=events):
        await eventually(lambda: len(warnings()) == 2, what="two warnings")
        row = conn.execute("SELECT tasks FROM akadze.workers").fetchone()
        assert row == (["greet", "report"],)  # the heartbeat records the tasks it runs
        seen = len(events.seen)
        renewed = await events.next("lease_renewed", after=seen)
        await events.next("lease_renewed", after=renewed)
    assert sorted(warnings()) == [
        "queue 'default' has ready jobs of task 'nosuch' (2 at the head of the queue) that no "
        "live worker of the queue runs: they wait until a worker whose app registers that "
        "task serves the queue (this worker runs greet, report)",
        "queue 'reports' has ready jobs of task 'gone' (1 at the head of the queue) that no "
        "live worker of the queue runs: they wait until a worker whose app registers that "
        "task serves the queue (this worker runs greet, report)",
    ]
