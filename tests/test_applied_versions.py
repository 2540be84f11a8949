"""akadze.applied_versions: the applied migration versions, read-only, [] without the
schema; akadze.BackoffPolicy is the type a task's backoff has."""

from __future__ import annotations

from datetime import timedelta

import psycopg

import akadze
from akadze import Akadze, BackoffPolicy, applied_versions
from akadze.migrate import available


def test_every_shipped_migration_is_listed(database_url: str) -> None:
    assert applied_versions(database_url) == [f"{m.version:04d}" for m in available()]


def test_a_database_without_the_schema_is_an_empty_list_and_stays_so(
        empty_database_url: str) -> None:
    assert applied_versions(empty_database_url) == []
    with psycopg.connect(empty_database_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'akadze'")
        assert row.fetchone() == (0,)  # nothing was created


def test_backoff_policy_is_what_a_task_takes(database_url: str) -> None:
    def linear(attempt: int) -> timedelta:
        return timedelta(seconds=attempt)

    policy: BackoffPolicy = linear
    app = Akadze(database_url)
    task = app.task("t", backoff=policy)(lambda: None)
    assert task.backoff is linear and akadze.BackoffPolicy is BackoffPolicy
