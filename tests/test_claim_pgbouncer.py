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


def test_a_claim_cut_off_from_its_server_leaves_no_stuck_connection(
    pgbouncer: Any, pgbouncer_url: str, database_url: str, conn: Conn,
) -> None:
    _queue(conn, 20_000)
    stop = threading.Event()
    ender = threading.Thread(target=_ender, args=(database_url, stop), daemon=True)
    client = psycopg.connect(pgbouncer_url, autocommit=True, prepare_threshold=None)
    failures: list[str] = []
    ender.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while len(failures) < 5 and time.monotonic() < deadline:
            try:
                claim(client, queue="q", slots=5, worker_id="w")
            except psycopg.Error as exc:
                failures.append(type(exc).__name__)
                # Either usable again or closed: never stuck in a transaction.
                assert client.closed or (
                    client.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                ), (failures, client.info.transaction_status)
                if client.closed:
                    client = psycopg.connect(pgbouncer_url, autocommit=True,
                                             prepare_threshold=None)
    finally:
        stop.set()
        ender.join(timeout=10)
    assert failures, "no claim was cut off within the deadline"
    try:
        assert claim(client, queue="q", slots=5, worker_id="w")
    finally:
        client.close()


async def test_an_async_claim_cut_off_from_its_server_leaves_no_stuck_connection(
    pgbouncer: Any, pgbouncer_url: str, database_url: str, conn: Conn,
) -> None:
    _queue(conn, 20_000)
    stop = threading.Event()
    ender = threading.Thread(target=_ender, args=(database_url, stop), daemon=True)
    client = await psycopg.AsyncConnection.connect(pgbouncer_url, autocommit=True,
                                                   prepare_threshold=None)
    failures: list[str] = []
    ender.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while len(failures) < 5 and time.monotonic() < deadline:
            try:
                await claim(client, queue="q", slots=5, worker_id="w")
            except psycopg.Error as exc:
                failures.append(type(exc).__name__)
                assert client.closed or (
                    client.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                ), (failures, client.info.transaction_status)
                if client.closed:
                    client = await psycopg.AsyncConnection.connect(
                        pgbouncer_url, autocommit=True, prepare_threshold=None)
    finally:
        stop.set()
        ender.join(timeout=10)
    assert failures, "no claim was cut off within the deadline"
    try:
        assert await claim(client, queue="q", slots=5, worker_id="w")
    finally:
        await client.close()
