"""A claim sent for a start-rate window's opening waits for it on the server
(``claim(..., not_before=...)``, claim_start), so the key's first start of the
window is the moment it opens; and a worker sends that claim a little early."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from worker_support import Events, eventually, insert_job

from akadze import Akadze, Worker
from akadze.claim import claim
from akadze.errors import ConfigurationError
from akadze.limits import set_limit_sync

Conn = psycopg.Connection[tuple[Any, ...]]


def _server_clock(conn: Conn) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _started_at(conn: Conn, job_id: int) -> datetime:
    row = conn.execute("SELECT started_at FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_the_claims_clock_is_not_before_the_moment_given(conn: Conn) -> None:
    job = insert_job(conn, "t", queue="q")
    # A moment 3 ms ahead of the server's clock: without the wait the claim's clock
    # would be well before it (the claim reaches the server in about a millisecond).
    moment = _server_clock(conn) + timedelta(milliseconds=3)
    got = claim(conn, queue="q", slots=1, worker_id="w", not_before=moment)
    assert [j.id for j in got] == [job]
    started = _started_at(conn, job)
    assert started >= moment
    # the start mark of a rate-limited key is the same clock
    set_limit_sync(conn, "r", max_starts=5, window=timedelta(seconds=1))
    keyed = insert_job(conn, "t", queue="q", limit_key="r", limited=True)
    moment = _server_clock(conn) + timedelta(milliseconds=3)
    assert [j.id for j in claim(conn, queue="q", slots=1, worker_id="w",
                                not_before=moment)] == [keyed]
    row = conn.execute("SELECT started_at FROM akadze.start_marks WHERE job_id = %s",
                       (keyed,)).fetchone()
    assert row is not None and row[0] >= moment


def test_a_moment_past_or_far_ahead_costs_no_long_wait(conn: Conn) -> None:
    first, second = insert_job(conn, "t", queue="q"), insert_job(conn, "t", queue="q")
    before = _server_clock(conn)
    claim(conn, queue="q", slots=1, worker_id="w", not_before=before - timedelta(hours=1))
    assert _started_at(conn, first) >= before
    # An hour ahead: the wait is capped (5 ms), so the claim comes back at once
    # with its own clock, long before that moment.
    far = _server_clock(conn) + timedelta(hours=1)
    began = time.monotonic()
    claim(conn, queue="q", slots=1, worker_id="w", not_before=far)
    assert time.monotonic() - began < 30  # not an hour
    assert _started_at(conn, second) < far - timedelta(minutes=59)


def test_not_before_is_checked(conn: Conn) -> None:
    with pytest.raises(ConfigurationError, match="not_before"):
        claim(conn, queue="q", slots=1, not_before=datetime(2026, 1, 1))  # naive
    with pytest.raises(ConfigurationError, match="not_before"):
        claim(conn, queue="q", slots=1, not_before="soon")  # type: ignore[arg-type]
    aware = _server_clock(conn)
    with pytest.raises(ConfigurationError, match="injected now"):
        claim(conn, queue="q", slots=1, now=aware, not_before=aware)


async def test_a_worker_claims_a_windows_opening_on_the_servers_clock(
    app: Akadze, conn: Conn
) -> None:
    """The claim a worker sends for a window's opening carries the opening (its
    ``claimed`` event says ``window``), and the limit still holds: the wait on
    the server never starts a job before its window opens (how soon after, the
    bench measures: ``akadze bench limits-busy``, start rate)."""
    set_limit_sync(conn, "r", max_starts=2, window=timedelta(milliseconds=400))

    @app.task("t")
    async def t() -> None:
        return None

    ids = [insert_job(conn, "t", limit_key="r", limited=True) for _ in range(6)]
    events = Events()
    async with Worker(app, slots=10, poll_interval=60.0, listen=False,
                      on_event=events) as worker:
        await eventually(lambda: worker.counts["succeeded"] == 6, what="six runs",
                         within=20)
    marks = [row[0] for row in conn.execute(
        "SELECT started_at FROM akadze.start_marks WHERE job_id = ANY(%s) "
        "ORDER BY started_at", (ids,))]
    assert len(marks) == 6
    window = timedelta(milliseconds=400)
    # two per window, never more: each pair a window after the one before
    assert marks[2] - marks[0] >= window and marks[4] - marks[2] >= window
    # The claims that started the later windows were sent for their openings.
    assert any(e.kind == "claimed" and e.detail == "window" for e in events.seen), \
        [(e.kind, e.detail) for e in events.seen]
