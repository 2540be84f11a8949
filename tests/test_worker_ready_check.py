"""Idle workers do not crowd the turn: the ready check before an idle claim, and the
spread of wake-ups over a queue's peers.

What a claim of the queue does is observed through the database: the test holds the
queue's claim turn (the advisory lock of claim_start) in a transaction of its own, so
a claim would wait for it in pg_locks, and the jobs' states say what was claimed or
swept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from worker_support import Events, eventually, insert_job, insert_peers, wait_state

from akadze import Akadze, Worker, pause_queue_sync, queries, resume_queue_sync, set_limit_sync
from akadze.worker._wakeup import IDLE_EASING, SPREAD_MAX, SPREAD_PER_PEER, wake_delay

TURN_CLASS = 6384484  # claim_start's advisory lock class


@contextmanager
def turn_held(database_url: str, queue: str = "default") -> Iterator[None]:
    """Hold ``queue``'s claim turn until the block ends: any claim of it waits."""
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (TURN_CLASS, queue))
        yield
        holder.rollback()


def turn_waiters(conn: psycopg.Connection[Any]) -> int:
    """Sessions waiting for a queue's claim turn (a claim that began)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
        "AND NOT granted", (TURN_CLASS,)).fetchone()
    assert row is not None
    return int(row[0])


async def idles(events: Events, count: int, queue: str = "default") -> None:
    """Until ``count`` idle events of ``queue`` were seen (each a look or claim that
    found nothing, followed by a wait)."""
    after = -1
    for _ in range(count):
        after = await events.next("idle", queue=queue, after=after)


def noop_app(app: Akadze) -> Akadze:
    @app.task("t")
    async def t() -> None:
        return None

    return app


@pytest.fixture
def easing() -> Iterator[None]:
    """Restore the process-wide switches after a test that flips them."""
    saved = (IDLE_EASING.look_first, IDLE_EASING.spread)
    yield
    IDLE_EASING.look_first, IDLE_EASING.spread = saved


async def test_an_idle_poll_of_an_empty_queue_takes_no_turn(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    # Polls only (listen=False): alone on its queue, a worker claims straight after a
    # notification (the turn is nobody else's), so the listener's first wake-up of
    # every queue could claim here; beside peers it looks (the next test).
    events = Events()
    with turn_held(database_url):
        async with Worker(noop_app(app), poll_interval=0.05, listen=False, on_event=events):
            await idles(events, 6)  # polls, each answered by the look alone
            assert turn_waiters(conn) == 0
        assert "claimed" not in events.kinds()


async def test_notifications_beside_peers_take_no_turn_on_an_empty_queue(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    # One other live worker of the queue (a row): notifications are looked at first.
    conn.execute("INSERT INTO akadze.workers (id, host, pid, queues, lease) "
                 "VALUES ('peer', 'h', 1, '{default}', interval '1 hour')")
    events = Events()
    with turn_held(database_url):
        async with Worker(noop_app(app), poll_interval=60, on_event=events):
            after = await events.next("idle")
            for _ in range(5):  # a notification nobody's job is behind
                conn.execute("NOTIFY akadze_jobs, 'default'")
                after = await events.next("idle", after=after)
            assert turn_waiters(conn) == 0
        assert "claimed" not in events.kinds()


async def test_without_the_look_the_same_poll_waits_for_the_turn(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str, easing: None
) -> None:
    # The control of the test above: its observation sees a claim when one is made.
    IDLE_EASING.look_first = False
    with turn_held(database_url):
        async with Worker(noop_app(app), poll_interval=0.05, shutdown_timeout=0.5):
            await eventually(lambda: turn_waiters(conn) == 1, what="a claim waiting")


async def test_a_start_rate_window_opening_is_claimed_without_a_look(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    # The claim that the key's max_starts held back knows when the window opens and
    # wakes then (a known due time): work it knows of, claimed straight away, not
    # looked at first (a round trip later at every window). No polls (poll_interval
    # 60 s) and no notifications (listen=False): due times are the only wake-ups.
    set_limit_sync(conn, "rate", max_starts=4, window=0.25)
    ids = [insert_job(conn, "t", limit_key="rate", limited=True) for _ in range(12)]
    events = Events()
    async with Worker(noop_app(app), poll_interval=60, listen=False, on_event=events):
        await idles(events, 1)  # the first look and claim are behind it
        looks = IDLE_EASING.looks
        for job_id in ids:
            await wait_state(conn, job_id, "succeeded")
        assert IDLE_EASING.looks == looks  # two windows opened, neither was looked at


async def test_the_look_never_skips_a_ready_job(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    # Future jobs at a higher priority lead both ready indexes; the due ones are
    # below them (the look walks the priority levels), one free and one limited.
    set_limit_sync(conn, "k", max_running=5)
    for priority in (9, 5):
        for _ in range(3):
            insert_job(conn, "t", priority=priority, run_at=_later(conn))
            insert_job(conn, "t", priority=priority, run_at=_later(conn), limit_key="k",
                       limited=True)
    events = Events()
    async with Worker(noop_app(app), poll_interval=0.05, listen=False, on_event=events):
        await idles(events, 3)
        free = insert_job(conn, "t", priority=1)
        await wait_state(conn, free, "succeeded")
        limited = insert_job(conn, "t", priority=-3, limit_key="k", limited=True)
        await wait_state(conn, limited, "succeeded")
        soon = insert_job(conn, "t", run_at=_later(conn, "0.3 seconds"))
        await wait_state(conn, soon, "succeeded")  # the look of a later poll finds it due
    future = conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = 'queued'").fetchone()
    assert future == (12,)


async def test_a_job_is_picked_up_on_notification_beside_many_peers(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    # 60 other live workers of the queue (rows only): this one spreads its wake-ups
    # over them (up to SPREAD_PER_PEER x 59 after a notification) and looks first.
    insert_peers(conn, 60)
    events = Events()
    async with Worker(noop_app(app), poll_interval=60, on_event=events):
        listening = await events.next("listening")
        await events.next("idle", after=listening)
        for _ in range(5):
            job_id = insert_job(conn, "t")
            await wait_state(conn, job_id, "succeeded", within=5)


async def test_a_due_expiry_or_cancel_is_still_swept_on_an_otherwise_empty_queue(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    expired = insert_job(conn, "t", expires_at=_later(conn, "-1 second"))
    cancelled = insert_job(conn, "t", cancel_requested=True)
    events = Events()
    async with Worker(noop_app(app), poll_interval=0.05, listen=False, on_event=events):
        await wait_state(conn, expired, "cancelled")
        await wait_state(conn, cancelled, "cancelled")
        await idles(events, 2)
    assert "claimed" not in events.kinds()


async def test_a_paused_queue_is_neither_claimed_nor_turned(
    app: Akadze, conn: psycopg.Connection[Any], database_url: str
) -> None:
    assert pause_queue_sync(conn, "default")
    job_id = insert_job(conn, "t")
    events = Events()
    with turn_held(database_url):
        async with Worker(noop_app(app), poll_interval=0.05, listen=False, on_event=events):
            await idles(events, 6)
            assert turn_waiters(conn) == 0
            assert _state(conn, job_id) == "queued"
    assert "claimed" not in events.kinds()
    async with Worker(app, poll_interval=0.05):
        assert resume_queue_sync(conn, "default")
        await wait_state(conn, job_id, "succeeded")


@pytest.mark.parametrize("analyzed", ["empty", "full"])
def test_the_look_reads_the_ready_indexes_on_stale_statistics(
    conn: psycopg.Connection[Any], analyzed: str
) -> None:
    # Analyzed while empty, then filled (a burst into a quiet queue), or analyzed full
    # of future jobs: the generic plan's only scans of jobs are one-entry probes of
    # the ready indexes.
    conn.execute("ANALYZE akadze.jobs")
    conn.execute("INSERT INTO akadze.jobs (queue, task, run_at) "
                 "SELECT 'default', 't', now() + interval '1 day' FROM generate_series(1, 20000)")
    if analyzed == "full":
        conn.execute("ANALYZE akadze.jobs")
    text = str(queries.get("worker_queue_ready").as_string(conn))
    text = (text.replace("%(queue)s", "$1").replace("%(now)s", "$2")
            .replace("%(peers)s", "$3"))
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("PREPARE look(text, timestamptz, boolean) AS " + text)
    row = conn.execute("EXPLAIN (FORMAT JSON) EXECUTE look('default', NULL, false)").fetchone()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    scans = list(_scans(plan[0]["Plan"]))
    on_jobs = [(kind, index) for kind, relation, index in scans if relation == "jobs"]
    assert on_jobs and all(kind == "Index Only Scan" for kind, _ in on_jobs), scans
    assert {index for _, index in on_jobs} == {"jobs_ready_free_idx", "jobs_ready_limited_idx"}


@given(st.integers(min_value=-3, max_value=100_000), st.floats(min_value=0, max_value=1),
       st.floats(min_value=0.001, max_value=3600))
def test_the_wake_delay_is_within_its_window(peers: int, draw: float,
                                             poll_interval: float) -> None:
    delay = wake_delay(peers, draw, poll_interval)
    if peers <= 1:
        assert delay == 0.0  # alone: today's pick-up, no spread
        return
    window = min(SPREAD_PER_PEER * (peers - 1), SPREAD_MAX, poll_interval / 4)
    assert 0.0 <= delay <= window + 1e-12
    assert delay <= poll_interval / 4 + 1e-12 and delay <= SPREAD_MAX + 1e-12


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0, max_value=1),
       st.floats(min_value=0, max_value=1), st.floats(min_value=0.001, max_value=60))
def test_the_wake_delay_grows_with_the_draw_and_the_peers(
        peers: int, a: float, b: float, poll_interval: float) -> None:
    low, high = sorted((a, b))
    assert wake_delay(peers, low, poll_interval) <= wake_delay(peers, high, poll_interval)
    assert wake_delay(peers, a, poll_interval) <= wake_delay(peers + 1, a, poll_interval)


@given(st.integers(min_value=2, max_value=10_000), st.floats(min_value=0.001, max_value=60))
def test_the_wake_delays_of_a_queues_peers_span_its_window(peers: int,
                                                           poll_interval: float) -> None:
    # The whole window is used (the draws spread the peers over it), from 0 up.
    window = min(SPREAD_PER_PEER * (peers - 1), SPREAD_MAX, poll_interval / 4)
    assert wake_delay(peers, 0.0, poll_interval) == 0.0
    assert wake_delay(peers, 1.0, poll_interval) == pytest.approx(window)


def _scans(node: dict[str, Any]) -> Iterator[tuple[str, str | None, str | None]]:
    if "Relation Name" in node:
        yield node["Node Type"], node["Relation Name"], node.get("Index Name")
    for child in node.get("Plans", []):
        yield from _scans(child)


def _later(conn: psycopg.Connection[Any], by: str = "1 day") -> Any:
    row = conn.execute("SELECT now() + %s::interval", (by,)).fetchone()
    assert row is not None
    return row[0]


def _state(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])
