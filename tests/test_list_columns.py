"""List views read what they show (issue 21, finding 6): ``list_jobs`` and
``akadze jobs list`` leave out args, result and errors; ``get_job`` reads them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from akadze import Akadze, get_job_sync, list_jobs, list_jobs_sync, queries
from akadze.cli import main

ERRORS = [
    {"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": "ValueError",
     "message": "bad", "traceback": "Traceback (most recent call last):\n  boom"},
    {"attempt": 2, "at": "2026-01-01T00:01:00+00:00", "error": "TimeoutError",
     "message": "too slow", "traceback": "Traceback (most recent call last):\n  late"},
]


@pytest.fixture
def job_id(app: Akadze, conn: psycopg.Connection[Any]) -> int:
    @app.task("store", queue="q9")
    def store(blob: str) -> None:
        return None

    new = app.tasks["store"].using().enqueue_sync(blob="x" * 100_000)
    conn.execute("UPDATE akadze.jobs SET state = 'failed', errors = %s, result = '[1, 2]' "
                 "WHERE id = %s", (json.dumps(ERRORS), new))
    return new


@pytest.mark.parametrize("name", ["jobs_list", "jobs_list_meta"])
def test_the_list_queries_do_not_select_the_large_columns(
        job_id: int, conn: psycopg.Connection[Any], name: str) -> None:
    params = {"queue": None, "states": None, "task": None, "limit": 10, "meta": '{"a": 1}'}
    with conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute(queries.get(name), params)
        assert cursor.description is not None
        columns = {column.name for column in cursor.description}
    assert not columns & {"args", "result", "errors"}
    assert {"last_error", "error_count", "meta", "state"} <= columns


async def test_a_listed_job_has_its_last_error_but_not_its_payloads(job_id: int,
                                                                   app: Akadze) -> None:
    [listed] = list_jobs_sync(app, queue="q9")
    assert (listed.id, listed.detailed, listed.args, listed.errors, listed.result) == (
        job_id, False, {}, [], None)
    assert listed.error_count == 2
    assert listed.last_error == {key: value for key, value in ERRORS[-1].items()
                                 if key != "traceback"}
    assert "args" not in listed.to_dict() and listed.to_dict()["error_count"] == 2
    assert [j.id for j in await list_jobs(app, state="failed")] == [job_id]
    full = get_job_sync(app, job_id)
    assert full.detailed and full.args == {"blob": "x" * 100_000} and full.result == [1, 2]
    assert full.errors == ERRORS and full.last_error == ERRORS[-1] and full.error_count == 2


def test_errors_written_as_something_else_do_not_break_the_list(
        job_id: int, app: Akadze, conn: psycopg.Connection[Any]) -> None:
    for errors in ('"oops"', '{"error": "x"}', '[1, "two"]', "[]"):
        conn.execute("UPDATE akadze.jobs SET errors = %s::jsonb WHERE id = %s", (errors, job_id))
        [listed] = list_jobs_sync(app)
        assert listed.last_error is None
        assert listed.error_count == (2 if errors == '[1, "two"]' else 0)


def test_cli_list_shows_the_last_error_and_json_leaves_the_payloads_out(
        job_id: int, database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "list", "--database-url", database_url]) == 0
    assert "too slow" in capsys.readouterr().out  # the table wraps the cell
    assert main(["jobs", "list", "--json", "--database-url", database_url]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["last_error"]["message"] == "too slow" and shown["error_count"] == 2
    assert not {"args", "result", "errors", "detailed"} & set(shown)
