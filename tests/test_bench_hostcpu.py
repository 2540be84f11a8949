"""The host's CPU as the benches read it (akadze.bench.hostcpu): the server's processes
and this process's own."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from akadze.bench.hostcpu import own_seconds, postmaster_of, server_seconds


def test_the_servers_cpu_counts_a_backend_that_worked_and_ended(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        postmaster = postmaster_of(conn)
        if postmaster is None:
            pytest.skip("the test server is not a process of this host")
        before = server_seconds(postmaster)
        assert before is not None
    # Another backend burns some CPU, then its connection ends: its time stays
    # counted (the postmaster reaped it).
    with psycopg.connect(database_url, autocommit=True) as busy:
        busy.execute("SELECT count(*) FROM generate_series(1, 5000000)").fetchone()
    after = server_seconds(postmaster, settle=0.1)
    assert after is not None and after - before >= 0.05


def test_a_pid_that_is_not_postgres_is_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    class Reply:
        def fetchone(self) -> tuple[int]:
            return (1,)  # pid 1 of this host: not a PostgreSQL backend

    class Conn:
        def execute(self, _query: str) -> Reply:
            return Reply()

    conn: Any = Conn()
    assert postmaster_of(conn) is None
    assert server_seconds(2 ** 22 + 12345) is None  # no such process


def test_this_processs_cpu_grows_with_its_work() -> None:
    before = own_seconds()
    total = 0
    for number in range(3_000_000):
        total += number * number
    assert total > 0 and own_seconds() - before > 0.01
