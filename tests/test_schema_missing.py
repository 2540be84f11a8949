"""Every entry point that touches the schema says "run akadze migrate" on a database
without it, as a MigrationError naming what was missing, never a raw psycopg error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import akadze
from akadze import Akadze, MigrationError


def _app(url: str) -> Akadze:
    app = Akadze(database_url=url)

    @app.task("greet")
    def greet(name: str) -> str:
        return name

    return app


SYNC_CALLS: dict[str, Callable[[Akadze, str], Any]] = {
    "enqueue_sync": lambda app, url: app.get_task("greet").using().enqueue_sync(name="a"),
    "enqueue_many_sync": lambda app, url: app.get_task("greet").using().enqueue_many_sync(
        [{"name": "a"}, {"name": "b"}]),
    "enqueue_sync with a limit key": lambda app, url: app.get_task("greet").using(
        limit_key="tenant:1").enqueue_sync(name="a"),
    "set_limit_sync": lambda app, url: akadze.set_limit_sync(url, "k", max_running=1),
    "list_limits_sync": lambda app, url: akadze.list_limits_sync(url),
    "list_jobs_sync": lambda app, url: akadze.list_jobs_sync(url),
    "get_job_sync": lambda app, url: akadze.get_job_sync(url, 1),
    "queue_snapshot_sync": lambda app, url: akadze.queue_snapshot_sync(url),
    "pause_queue_sync": lambda app, url: akadze.pause_queue_sync(url, "q"),
    "request_cancel_sync": lambda app, url: akadze.request_cancel_sync(url, 1),
    "requeue_sync": lambda app, url: akadze.requeue_sync(url, 1),
}


@pytest.mark.parametrize("call", list(SYNC_CALLS), ids=list(SYNC_CALLS))
def test_sync_entry_points_say_run_migrate(empty_database_url: str, call: str) -> None:
    app = _app(empty_database_url)
    with pytest.raises(MigrationError) as raised:
        SYNC_CALLS[call](app, empty_database_url)
    message = str(raised.value)
    assert message.startswith("the database has no akadze schema (or an older one: ")
    assert message.endswith("does not exist): run akadze migrate"), message
    assert "\n" not in message
    assert isinstance(raised.value.__cause__, psycopg.Error)


async def test_async_enqueues_say_run_migrate(empty_database_url: str) -> None:
    app = _app(empty_database_url)
    task = app.get_task("greet")
    with pytest.raises(MigrationError, match="run akadze migrate"):
        await task.using().enqueue(name="a")
    with pytest.raises(MigrationError, match="run akadze migrate"):
        await task.using().enqueue_many([{"name": "a"}])
    # joined to the caller's own transaction, the same
    async with await psycopg.AsyncConnection.connect(empty_database_url) as conn:
        with pytest.raises(MigrationError, match=r"relation \"akadze\.\w+\" does not exist"):
            async with conn.transaction():
                await task.using(session=conn).enqueue(name="a")


def test_a_hooks_own_missing_table_is_not_taken_for_the_schema(database_url: str) -> None:
    app = _app(database_url)

    @app.on_enqueue
    def audit(conn: psycopg.Connection[Any], job: object) -> None:
        conn.execute("INSERT INTO audit_log VALUES (1)")  # the application's table

    with pytest.raises(psycopg.errors.UndefinedTable, match="audit_log"):
        app.get_task("greet").using().enqueue_sync(name="a")


def test_the_readme_quickstart_before_migrate_is_one_clear_error(
    empty_database_url: str, tmp_path: Any
) -> None:
    script = tmp_path / "early.py"
    script.write_text(
        "import asyncio\n"
        "from akadze import Akadze\n"
        "app = Akadze()\n"
        "@app.task('greet')\n"
        "def greet(name: str) -> str:\n"
        "    return name\n"
        "asyncio.run(greet.using().enqueue(name='ada'))\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60,
        env={"AKADZE_DATABASE_URL": empty_database_url, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("akadze.errors.MigrationError: the database has no akadze schema")
    assert last.endswith(": run akadze migrate"), last
