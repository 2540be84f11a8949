"""A claim through PgBouncer (transaction pooling) whose server connection dies.

PgBouncer answers "server conn crashed?" and drops the client, but psycopg in
pipeline mode may still think the transaction open: left as it was, the connection
refused every later claim ("not inside a transaction"). A failed claim that cannot
roll back closes its connection instead.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from akadze.claim import claim

Conn = psycopg.Connection[Any]

DEADLINE = 30.0


def _ender(database_url: str, stop: threading.Event) -> None:
    """End every server connection of the test's database but its own, again and
    again (PgBouncer's server connections among them), until ``stop``."""
    with psycopg.connect(database_url, autocommit=True) as killer:
        while not stop.is_set():
            killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'")
            stop.wait(0.02)


def _queue(conn: Conn, jobs: int) -> None:
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task) SELECT 'q', 'noop' FROM generate_series(1, %s)",
        (jobs,))


class _Client:
    """A claiming connection through PgBouncer, sync or async, made again once closed."""

    def __init__(self, url: str, sync: bool) -> None:
        self.url, self.sync = url, sync
        self.conn: Any = None

    async def open(self) -> None:
        if self.sync:
            self.conn = psycopg.connect(self.url, autocommit=True, prepare_threshold=None)
        else:
            self.conn = await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, prepare_threshold=None)

    async def claim(self) -> list[Any]:
        if self.sync:
            return list(claim(self.conn, queue="q", slots=5, worker_id="w"))
        return list(await claim(self.conn, queue="q", slots=5, worker_id="w"))

    async def close(self) -> None:
        done = self.conn.close()
        if not self.sync:
            await done


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_claim_cut_off_from_its_server_leaves_no_stuck_connection(
    pgbouncer: Any, pgbouncer_url: str, database_url: str, conn: Conn, sync: bool,
) -> None:
    _queue(conn, 20_000)
    stop = threading.Event()
    ender = threading.Thread(target=_ender, args=(database_url, stop), daemon=True)
    client = _Client(pgbouncer_url, sync)
    await client.open()
    failures: list[str] = []
    ender.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while len(failures) < 5 and time.monotonic() < deadline:
            try:
                await client.claim()
            except psycopg.Error as exc:
                failures.append(type(exc).__name__)
                # Either usable again or closed: never stuck in a transaction.
                assert client.conn.closed or (
                    client.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                ), (failures, client.conn.info.transaction_status)
                if client.conn.closed:
                    await client.open()
    finally:
        stop.set()
        ender.join(timeout=10)
    assert failures, "no claim was cut off within the deadline"
    try:
        assert await client.claim()
    finally:
        await client.close()
