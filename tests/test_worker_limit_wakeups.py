"""A job of a key at its limit starts as soon as the key has room, not at the next
poll: the worker's own outcome write, a notification from another worker's outcome
(migration 0010), and the opening of a start-rate window each wake the claim.

Every worker here polls once a minute: a job that waited for the poll would miss
the test's deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from worker_support import Events, eventually, insert_job

from akadze import Akadze, Worker, current
from akadze.limits import set_limit_sync

POLL = 60.0


def _state(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_the_workers_own_outcome_lets_the_next_job_of_the_key_start(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    set_limit_sync(conn, "k", max_running=1)
    started: list[int] = []

    @app.task("t")
    async def t() -> None:
        started.append(current().id)

    ids = [insert_job(conn, "t", limit_key="k", limited=True) for _ in range(3)]
    # listen=False: no notification can help; only the outcome write itself.
    async with Worker(app, slots=4, poll_interval=POLL, listen=False) as worker:
        await eventually(lambda: worker.counts["succeeded"] == 3, what="three runs",
                         within=10)
    assert started == ids  # one at a time, in order


async def test_another_workers_outcome_wakes_an_idle_worker(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    set_limit_sync(conn, "k", max_running=1)

    @app.task("t")
    async def t() -> None:
        return None

    # A run of the key elsewhere: running, claimed by another worker.
    elsewhere = insert_job(conn, "t", limit_key="k", limited=True)
    conn.execute("INSERT INTO akadze.workers (id, host, pid) VALUES ('other', 'h', 1)")
    conn.execute("UPDATE akadze.jobs SET state = 'running', worker_id = 'other', "
                 "started_at = now(), attempt = 1, run_count = 1 WHERE id = %s", (elsewhere,))
    waiting = insert_job(conn, "t", limit_key="k", limited=True)
    events = Events()
    async with Worker(app, slots=4, poll_interval=POLL, on_event=events) as worker:
        await events.next("idle", queue="default")  # the claim found the key full
        assert _state(conn, waiting) == "queued"
        # The other worker writes its outcome: a notification (migration 0010).
        conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                     "WHERE id = %s", (elsewhere,))
        await eventually(lambda: worker.counts["succeeded"] == 1, what="the waiting job",
                         within=10)
    assert _state(conn, waiting) == "succeeded"


async def test_a_start_rate_limited_job_starts_when_the_window_opens(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    set_limit_sync(conn, "r", max_starts=2, window=timedelta(seconds=1))

    @app.task("t")
    async def t() -> None:
        return None

    ids = [insert_job(conn, "t", limit_key="r", limited=True) for _ in range(5)]
    async with Worker(app, slots=10, poll_interval=POLL, listen=False) as worker:
        await eventually(lambda: worker.counts["succeeded"] == 5, what="five runs",
                         within=10)
    starts = [row[0] for row in conn.execute(
        "SELECT started_at FROM akadze.jobs WHERE id = ANY(%s) ORDER BY started_at", (ids,))]
    # Two per window, never more (the limit holds), each pair a window after the last.
    assert starts[2] - starts[0] >= timedelta(seconds=1)
    assert starts[4] - starts[2] >= timedelta(seconds=1)


def test_the_next_start_query_tells_a_window_open_already_from_a_key_held_otherwise(
    conn: psycopg.Connection[Any]
) -> None:
    """limit_next_start, which a claim loop asks when its claim left keys without
    room: the opening in the server's clock with the clock itself (the loop turns
    one into its own time by the other); no opening but `open_now` for a window
    already open while the key has room by its count (a claim that came a moment
    too early claims again instead of waiting for a poll); neither for a key held
    by max_running."""
    from psycopg.types.json import Jsonb

    from akadze import queries

    def next_start(key: str) -> tuple[Any, ...]:
        row = conn.execute(queries.get("limit_next_start"),
                           {"keys": Jsonb([key]), "now": None}).fetchone()
        assert row is not None
        return tuple(row)

    set_limit_sync(conn, "held", max_starts=1, window=timedelta(hours=1))
    job = insert_job(conn, "t", limit_key="held", limited=True)
    conn.execute("INSERT INTO akadze.start_marks (key, started_at, job_id) "
                 "VALUES ('held', now() - interval '1 minute', %s)", (job,))
    seconds, opens, clock, open_now, opens_at = next_start("held")
    assert 3500 < seconds <= 3540 and opens - clock == pytest.approx(seconds, abs=5)
    assert not open_now
    # the same opening, exact: what the claim sent for it waits for (not_before)
    assert opens_at.timestamp() == pytest.approx(opens, abs=1e-6)

    set_limit_sync(conn, "open", max_starts=1, max_running=1, window=timedelta(hours=1))
    assert next_start("open")[0] is None and next_start("open")[3] is True
    conn.execute("UPDATE akadze.limits SET running = 1 WHERE key = 'open'")
    assert next_start("open")[0] is None and next_start("open")[3] is False
