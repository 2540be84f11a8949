from __future__ import annotations

import psycopg
import pytest

from akadze.worker import is_transient


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.LockNotAvailable("lock timeout"),  # lock_timeout inside a claim
        psycopg.errors.QueryCanceled("statement timeout"),
        psycopg.errors.DeadlockDetected("deadlock"),
        psycopg.errors.AdminShutdown("terminating connection"),
        psycopg.errors.TooManyConnections("too many"),
    ],
)
def test_errors_that_pass_with_time_are_transient(error: psycopg.Error) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.UndefinedTable("no akadze.jobs"),
        psycopg.errors.SyntaxError("bad sql"),
        ValueError("not a database error"),
    ],
)
def test_errors_that_need_a_fix_are_not_transient(error: Exception) -> None:
    assert not is_transient(error)
