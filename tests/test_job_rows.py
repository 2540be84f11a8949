"""The job row is defined once: the job_columns and job_summary_columns fragments of
sql/queries/jobs.sql, read by name into ClaimedJob and JobSummary."""

from __future__ import annotations

import dataclasses
from importlib import resources
from typing import Any

import psycopg
import pytest

from akadze import queries
from akadze.claim import claim
from akadze.jobs import JOB_COLUMNS, ClaimedJob, JobState, job_rows, job_state_rows
from akadze.overview import JobSummary

Conn = psycopg.Connection[tuple[Any, ...]]

# Queries that return the job columns, with parameters that match no job.
RETURNING_JOBS = {
    "claim_cancel_due": {"queue": "none", "now": None, "tasks": None},
    "claim_sweep": {"queue": "none", "now": None, "tasks": None},
    "claim_take": {"queue": "none", "now": None, "tasks": None, "ids": [],
                   "worker_id": "w"},
    "worker_running_in_queue": {"worker_id": "none", "queue": "none"},
    "job_lock": {"id": 0},
    "job_for_cancel": {"id": 0},
    "job_requeue": {"id": 0, "now": None},
    "rescue_expired": {"now": None, "orphan_grace": 30.0},
}
WITH_STATE = {"job_lock", "job_for_cancel", "job_requeue", "rescue_expired"}


def columns(conn: Conn, name: str, params: dict[str, Any]) -> list[str]:
    with conn.transaction(force_rollback=True):
        cur = conn.execute(queries.get(name), params)
        assert cur.description is not None
        return [column.name for column in cur.description]


def test_every_query_that_returns_a_job_returns_the_fields_of_claimed_job(conn: Conn) -> None:
    # Every field but ``unreadable``, which reading the row makes.
    assert tuple(f.name for f in dataclasses.fields(ClaimedJob)) == (*JOB_COLUMNS, "unreadable")
    for name, params in RETURNING_JOBS.items():
        extra = ["state"] if name in WITH_STATE else []
        assert columns(conn, name, params) == [*JOB_COLUMNS, *extra], name


def test_the_job_summary_queries_return_the_fields_of_job_summary(conn: Conn) -> None:
    # Every field but two that reading the row makes (detailed, unreadable).
    fields = [f.name for f in dataclasses.fields(JobSummary)
              if f.name not in ("detailed", "unreadable")]
    # get_job reads the job whole (error_count and last_error come from its errors);
    # the lists read the count and the last error instead of args, errors and result.
    whole = [f for f in fields if f not in ("last_error", "error_count")]
    listed = [f for f in fields if f not in ("args", "errors", "result")]
    for name, params, expected in (
        ("job_get", {"id": 0}, whole),
        ("jobs_list", {"queue": None, "states": None, "task": None, "limit": 1}, listed),
        ("jobs_list_meta", {"queue": None, "states": None, "task": None, "limit": 1,
                            "meta": "{}"}, listed),
    ):  # read by name (dict_row): the set of columns matters, not their order
        assert sorted(columns(conn, name, params)) == sorted(expected), name


def test_the_column_list_is_written_only_in_the_fragment() -> None:
    folder = resources.files("akadze").joinpath("sql", "queries")
    spelled = {entry.name for entry in folder.iterdir() if entry.name.endswith(".sql")
               and "j.max_attempts, j.meta" in entry.read_text(encoding="utf-8")}
    assert spelled == {"jobs.sql"}


def test_rows_are_read_by_name_whatever_the_column_order(conn: Conn) -> None:
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, meta) "
                 "VALUES ('q', 't', 'k', '{\"m\": 1}')")
    reversed_columns = ", ".join(reversed((*JOB_COLUMNS, "state")))
    job, state = conn.cursor(row_factory=job_state_rows).execute(
        f"SELECT 'extra' AS other, {reversed_columns} FROM akadze.jobs").fetchall()[0]
    assert (job.queue, job.task, job.limit_key, job.meta, job.run_count) == (
        "q", "t", "k", {"m": 1}, 0)
    assert state is JobState.QUEUED
    # ... and a claim hands out the same record
    assert job.claim_token is None
    claimed = claim(conn, queue="q", slots=1)
    started_at, token = claim_started(conn)
    assert token is not None
    assert claimed == [
        dataclasses.replace(job, run_count=1, attempt=1, worker_id=None,
                            started_at=started_at, claim_token=token)]


def claim_started(conn: Conn) -> tuple[Any, Any]:
    row = conn.execute("SELECT started_at, claim_token FROM akadze.jobs").fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_row_without_a_job_column_is_refused_by_name(conn: Conn) -> None:
    with pytest.raises(RuntimeError, match=r"lacks the columns \['claim_token'\]"):
        conn.cursor(row_factory=job_rows).execute(
            "SELECT " + ", ".join(JOB_COLUMNS[:-1]) + " FROM akadze.jobs")


def nested(depth: int) -> str:
    """A JSON object nested ``depth`` deep, as text."""
    return '{"a": ' + "[" * depth + "]" * depth + "}"


def test_a_row_nested_too_deep_to_read_is_a_job_marked_unreadable(conn: Conn) -> None:
    # Written by SQL, as another tool or a hand-written UPDATE could: jsonb takes it,
    # Python's json cannot read it back (RecursionError past about 1 000 levels).
    conn.execute("INSERT INTO akadze.jobs (queue, task, args, meta) VALUES "
                 "('q', 't', %s::jsonb, '{\"m\": 1}'), ('q', 't', '{\"x\": 2}', %s::jsonb),"
                 " ('q', 't', '{\"ok\": [[1]]}', '{}')",
                 (nested(5_000), nested(5_000)))
    jobs = claim(conn, queue="q", slots=5)
    assert [(job.args, job.meta) for job in jobs] == [({}, {"m": 1}), ({"x": 2}, {}),
                                                      ({"ok": [[1]]}, {})]
    assert [job.unreadable for job in jobs] == [
        "its stored arguments are nested too deeply to read (past Python's recursion limit)",
        "its stored meta is nested too deeply to read (past Python's recursion limit)",
        None,
    ]
    # Every reader of the job row survives it: a lock for an operator's action too.
    job, state = conn.cursor(row_factory=job_state_rows).execute(
        queries.get("job_lock"), {"id": jobs[0].id}).fetchall()[0]
    assert (job.id, job.args, state) == (jobs[0].id, {}, JobState.RUNNING)
    assert job.unreadable is not None and "arguments" in job.unreadable
    # A depth Python reads is read whole.
    conn.execute("UPDATE akadze.jobs SET args = %s::jsonb WHERE id = %s",
                 (nested(500), jobs[0].id))
    job = conn.cursor(row_factory=job_rows).execute(
        queries.get("job_lock"), {"id": jobs[0].id}).fetchall()[0]
    assert job.unreadable is None and list(job.args) == ["a"]
