"""A claim's clock is read once it holds its queue's turn, not when its transaction began.

A claim's transaction begins before it waits for the queue's turn (claim_start's
advisory lock). Read as ``now()`` (the transaction's start), its clock would stay at
the moment it began to wait, so a job enqueued while it waited (``run_at`` defaults to
the enqueue's ``now()``, later than that) would not be due for it: the claim came back
empty although the job was committed, queued and due when the claim got its turn. Many
workers woken by one notification queue up for the turn; every claim in that queue was
blind to the jobs enqueued after it began, so each new job waited for a claim that
began after it, at the back of the queue (issue 16: pick-up in 1-2 s beside 100 idle
workers, where p50 was 23 ms).

Observed through the database: the test holds the queue's turn in a transaction of its
own, so the claim waits for it in pg_locks, and enqueues while it waits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from akadze.claim import claim

TURN_CLASS = 6384484  # claim_start's advisory lock class


@contextmanager
def turn_held(database_url: str, queue: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold ``queue``'s claim turn until the holder's transaction ends."""
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (TURN_CLASS, queue))
        yield holder
        holder.rollback()


def wait_for_turn_waiter(database_url: str, within: float = 10.0) -> None:
    """Until some session waits for a claim turn (the claim began and waits)."""
    deadline = time.monotonic() + within
    with psycopg.connect(database_url, autocommit=True) as watcher:
        while True:
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = %s AND NOT granted", (TURN_CLASS,)).fetchone()
            if row and row[0]:
                return
            assert time.monotonic() < deadline, "the claim never waited for the turn"
            time.sleep(0.01)


def enqueue(database_url: str, queue: str) -> int:
    """One job, committed, due at once (run_at defaults to the insert's now())."""
    with psycopg.connect(database_url, autocommit=True) as producer:
        row = producer.execute(
            "INSERT INTO akadze.jobs (queue, task) VALUES (%s, 't') RETURNING id",
            (queue,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_claim_takes_what_was_enqueued_while_it_waited_for_the_turn(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    with turn_held(database_url, "q") as holder, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(claim, conn, queue="q", slots=5, worker_id="w")
        wait_for_turn_waiter(database_url)
        job = enqueue(database_url, "q")
        assert not pending.done()
        holder.rollback()  # the turn is the claim's now
        got = pending.result(timeout=10)
    assert [j.id for j in got] == [job]


async def test_an_async_claim_too(database_url: str,
                                  aconn: psycopg.AsyncConnection[Any]) -> None:
    with turn_held(database_url, "q") as holder:
        pending = asyncio.ensure_future(claim(aconn, queue="q", slots=5, worker_id="w"))
        await asyncio.to_thread(wait_for_turn_waiter, database_url)
        job = await asyncio.to_thread(enqueue, database_url, "q")
        assert not pending.done()
        holder.rollback()
        got = await asyncio.wait_for(pending, 10)
    assert [j.id for j in got] == [job]


def test_a_job_due_after_the_turn_is_not_taken(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    # The clock is the turn's moment, not later: a job due an hour after it waits.
    conn.execute("INSERT INTO akadze.jobs (queue, task, run_at) "
                 "VALUES ('q', 't', now() + interval '1 hour')")
    with turn_held(database_url, "q") as holder, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(claim, conn, queue="q", slots=5, worker_id="w")
        wait_for_turn_waiter(database_url)
        holder.rollback()
        assert pending.result(timeout=10) == []
