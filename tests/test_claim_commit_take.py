"""A claim without transition hooks sends its locks, its guarded take and its
COMMIT in one round trip (akadze.claim._windows, _take_committing). These tests
make the take's round trip meet what can go wrong between the plan and the take
(another transaction holds a planned row, a key lost its room, another claim
holds a key's limits row) and check that the claim still returns what a claim
may return: the right jobs, never a key over its limit, and the remaining slots
claimed in a new transaction."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from claim_support import watch_steps

from akadze.app import Akadze
from akadze.claim import claim, claim_oracle
from akadze.claim._steps import Batch, Statement

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Conn = psycopg.Connection[tuple[Any, ...]]


class Trace:
    """The statements of each round trip of the claims made meanwhile (by name),
    whether the round trip committed, and a hook run just before the first
    round trip that takes (``before_take``)."""

    def __init__(self) -> None:
        self.trips: list[tuple[list[str], bool]] = []
        self.before_take: Callable[[], None] | None = None


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trace]:
    seen = Trace()

    def step_seen(step: Batch | Statement, names: list[str]) -> None:
        if "claim_take" in names and seen.before_take is not None:
            hook, seen.before_take = seen.before_take, None
            hook()
        seen.trips.append((names, isinstance(step, Batch) and step.commit))

    watch_steps(monkeypatch, on_claim=lambda: None, on_step=step_seen)
    yield seen


def fill(conn: Conn, rows: list[str | None]) -> list[int]:
    """Queued jobs of queue q with these keys, in this queue order; their ids."""
    cur = conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, limited, run_at) "
        "SELECT 'q', 't', k, EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = k), "
        "%s - make_interval(secs => 10000 - n) "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS r(k, n) ORDER BY n RETURNING id",
        (NOW, rows))
    return [row[0] for row in cur.fetchall()]


def running(conn: Conn, key: str, count: int = 1, queue: str = "elsewhere") -> None:
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state) "
                 "SELECT %s, 't', %s, 'running' FROM generate_series(1, %s)",
                 (queue, key, count))


def over_limit(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT j.limit_key, count(*) FROM akadze.jobs j "
        "JOIN akadze.limits l ON l.key = j.limit_key AND l.max_running IS NOT NULL "
        "WHERE j.state = 'running' GROUP BY j.limit_key, l.max_running "
        "HAVING count(*) > l.max_running").fetchall()


def test_a_claim_takes_locks_and_commits_in_one_round_trip(conn: Conn, trace: Trace) -> None:
    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES ('a', 3)")
    fill(conn, ["a", None, "a", None, "a", "a"])
    got = claim(conn, queue="q", slots=5, now=NOW)
    assert [job.limit_key for job in got] == ["a", None, "a", None, "a"]
    names, committed = trace.trips[-1]
    assert names == ["claim_lock", "claim_take"] and committed
    assert len(trace.trips) == 2  # the first read, then the take with its COMMIT
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_claim_with_transition_hooks_keeps_one_transaction(
        database_url: str, conn: Conn, trace: Trace) -> None:
    app = Akadze(database_url=database_url)
    seen: list[tuple[Any, ...]] = []

    with psycopg.connect(database_url, autocommit=True) as outside:
        @app.on_transition
        def note(hook_conn: Any, job: Any, old: str, new: str) -> None:
            # the claim has not committed when its hooks run
            seen.append(outside.execute(
                "SELECT state FROM akadze.jobs WHERE id = %s", (job.id,)).fetchone())

        fill(conn, [None, None])
        assert len(claim(conn, queue="q", slots=2, now=NOW, app=app)) == 2
    assert seen == [("queued",), ("queued",)]
    assert not any(committed for _, committed in trace.trips)


def test_a_row_held_elsewhere_is_left_and_the_slots_filled_in_a_new_transaction(
        database_url: str, conn: Conn, trace: Trace) -> None:
    ids = fill(conn, [None] * 6)
    with psycopg.connect(database_url) as other:
        def hold() -> None:
            other.execute("SELECT 1 FROM akadze.jobs WHERE id = %s FOR UPDATE", (ids[1],))

        trace.before_take = hold
        got = claim(conn, queue="q", slots=3, now=NOW)
        other.rollback()
    # the first take got ids 0 and 2 and committed them; the new transaction
    # planned the last slot from the head, where id 1 is still held
    assert [job.id for job in got] == [ids[0], ids[2], ids[3]]
    committed = [names for names, commit in trace.trips if commit]
    assert committed == [["claim_take"]]
    assert ["claim_start", "claim_sweep"] in [names for names, _ in trace.trips]


def test_a_key_that_lost_its_room_before_the_take_is_refused_and_planned_again(
        database_url: str, conn: Conn, trace: Trace) -> None:
    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES ('a', 2)")
    ids = fill(conn, ["a", "a", None, None])
    with psycopg.connect(database_url, autocommit=True) as other:
        # another queue starts a job of the key after this claim read its state
        trace.before_take = lambda: running(other, "a")
        got = claim(conn, queue="q", slots=3, now=NOW)
    assert [job.id for job in got] == [ids[0], ids[2], ids[3]]
    assert over_limit(conn) == []
    # what the oracle says of the same queue now that the claim's jobs are back
    conn.execute("UPDATE akadze.jobs SET state = 'queued' WHERE id = ANY(%s)",
                 ([job.id for job in got],))
    assert [job.id for job in claim_oracle(conn, queue="q", slots=3, now=NOW)] == [
        job.id for job in got]


def test_a_key_held_by_another_claim_is_refused_then_waited_for(
        database_url: str, conn: Conn, trace: Trace) -> None:
    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES ('a', 5)")
    ids = fill(conn, ["a", None, None, None])
    other = psycopg.connect(database_url)
    released = threading.Event()
    releasers: list[threading.Thread] = []

    def release_when_waited_for() -> None:
        # the claim waits for the key (its one lock that may wait: it holds no
        # limits row and no job); the holder ends once the wait is seen (or once
        # the claim returned, so that it never touches a closed connection)
        with psycopg.connect(database_url, autocommit=True) as watch:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not released.is_set() and watch.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                    "WHERE NOT l.granted AND d.datname = current_database()").fetchone() == (0,):
                released.wait(0.01)
        other.rollback()

    def hold() -> None:
        other.execute("SELECT 1 FROM akadze.limits WHERE key = 'a' FOR NO KEY UPDATE")
        releasers.append(threading.Thread(target=release_when_waited_for, daemon=True))
        releasers[-1].start()

    trace.before_take = hold
    try:
        got = claim(conn, queue="q", slots=3, now=NOW)
    finally:
        released.set()
        for releaser in releasers:
            releaser.join(timeout=30)
        other.close()
    # refused: nothing taken in the first transaction; the next one locks the
    # key the classic way, finds it held, waits for it, and takes as planned
    assert [job.id for job in got] == [ids[0], ids[1], ids[2]]
    committed = [names for names, commit in trace.trips if commit]
    assert committed == [["claim_lock", "claim_take"]]
    assert "claim_lock_first" in [name for names, _ in trace.trips for name in names]


def test_the_guard_counts_start_marks(database_url: str, conn: Conn, trace: Trace) -> None:
    conn.execute("INSERT INTO akadze.limits (key, max_starts, \"window\") "
                 "VALUES ('r', 2, interval '1 hour')")
    ids = fill(conn, ["r", "r", "r", None])
    with psycopg.connect(database_url, autocommit=True) as other:
        # another queue starts a job of the key after this claim read its state
        trace.before_take = lambda: other.execute(
            "WITH j AS (INSERT INTO akadze.jobs (queue, task, limit_key, state) "
            "VALUES ('elsewhere', 't', 'r', 'succeeded') RETURNING id) "
            "INSERT INTO akadze.start_marks (key, started_at, job_id) "
            "SELECT 'r', %s, j.id FROM j", (NOW,))
        got = claim(conn, queue="q", slots=3, now=NOW)
    # one start left after the mark: the first row of 'r', then the free row
    assert [job.id for job in got] == [ids[0], ids[3]]
    marks = conn.execute("SELECT count(*) FROM akadze.start_marks WHERE key = 'r'").fetchone()
    assert marks == (2,)  # the other's and ours: the limit, not over it
