"""The claim's contract on small hand-built queues, for both claim implementations."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.claim import claim, claim_oracle
from akadze.errors import ConfigurationError

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
Conn = psycopg.Connection[tuple[Any, ...]]

CLAIMS = pytest.mark.parametrize("claim_fn", [claim, claim_oracle], ids=["claim", "oracle"])


def add(conn: Conn, queue: str = "q", *, key: str | None = None, priority: int = 0,
        age: float = 0.0, task: str = "t", state: str = "queued", **extra: Any) -> int:
    """Insert one job; ``age`` seconds before NOW (so larger ages come first)."""
    cols = {"queue": queue, "task": task, "limit_key": key, "priority": priority,
            "run_at": NOW - timedelta(seconds=age), "state": state, **extra}
    names = ", ".join(cols)
    marks = ", ".join(f"%({c})s" for c in cols)
    row = conn.execute(
        f"INSERT INTO akadze.jobs ({names}) VALUES ({marks}) RETURNING id", cols
    ).fetchone()
    assert row is not None
    return int(row[0])


def limit(conn: Conn, key: str, *, max_running: int | None = None,
          max_starts: int | None = None, window: timedelta | None = None) -> None:
    conn.execute(
        'INSERT INTO akadze.limits (key, max_running, max_starts, "window") '
        "VALUES (%s, %s, %s, %s)",
        (key, max_running, max_starts, window),
    )


def ids(jobs: list[Any]) -> list[int]:
    return [j.id for j in jobs]


@CLAIMS
def test_queue_order_and_effects(conn: Conn, claim_fn: Callable[..., Any]) -> None:
    low = add(conn, age=30)
    high = add(conn, priority=5, age=1)
    old = add(conn, age=60)
    tie_a = add(conn, age=10)
    tie_b = add(conn, age=10)
    future = add(conn, age=-5)
    other_queue = add(conn, "other", age=100)
    got = claim_fn(conn, queue="q", slots=4, worker_id="w1", now=NOW)
    assert ids(got) == [high, old, low, tie_a]
    job = got[0]
    assert (job.run_count, job.attempt, job.worker_id, job.started_at) == (1, 1, "w1", NOW)
    states = dict(conn.execute("SELECT id, state::text FROM akadze.jobs").fetchall())
    assert states[tie_b] == states[future] == states[other_queue] == "queued"
    assert all(states[i] == "running" for i in ids(got))
    # the next claim takes what is left, and never a job that is not due
    assert ids(claim_fn(conn, queue="q", slots=5, now=NOW)) == [tie_b]


@CLAIMS
def test_max_running_counts_every_queue(conn: Conn, claim_fn: Callable[..., Any]) -> None:
    limit(conn, "k", max_running=2)
    add(conn, "elsewhere", key="k", state="running")
    a = add(conn, key="k", age=9)
    add(conn, key="k", age=8)
    free = add(conn, age=1)
    assert ids(claim_fn(conn, queue="q", slots=5, now=NOW)) == [a, free]
    assert claim_fn(conn, queue="q", slots=5, now=NOW) == []


@CLAIMS
def test_max_starts_window_records_and_prunes_marks(
    conn: Conn, claim_fn: Callable[..., Any]
) -> None:
    limit(conn, "k", max_starts=2, window=timedelta(minutes=1))
    conn.execute(
        "INSERT INTO akadze.start_marks (key, started_at, job_id) VALUES "
        "('k', %s, 0), ('k', %s, 0)",
        (NOW - timedelta(seconds=30), NOW - timedelta(minutes=5)),
    )
    jobs = [add(conn, key="k", age=10 - i) for i in range(4)]
    assert ids(claim_fn(conn, queue="q", slots=5, now=NOW)) == jobs[:1]
    marks = conn.execute(
        "SELECT started_at, job_id FROM akadze.start_marks ORDER BY started_at"
    ).fetchall()
    # the 5-minute-old mark is kept for a margin past the window (claims with an
    # earlier clock may still count it); it does not count here
    assert marks == [(NOW - timedelta(minutes=5), 0), (NOW - timedelta(seconds=30), 0),
                     (NOW, jobs[0])]
    # 31 s later the old mark has left the window: one more start
    later = NOW + timedelta(seconds=31)
    assert ids(claim_fn(conn, queue="q", slots=5, now=later)) == jobs[1:2]
    # marks past the window and the margin are pruned when the key starts again
    much_later = NOW + timedelta(minutes=10)
    assert ids(claim_fn(conn, queue="q", slots=1, now=much_later)) == jobs[2:3]
    left = [r[0] for r in conn.execute("SELECT job_id FROM akadze.start_marks ORDER BY 1")]
    assert left == [jobs[2]]


@CLAIMS
def test_cancel_requested_and_expired_are_cancelled(
    conn: Conn, claim_fn: Callable[..., Any]
) -> None:
    asked = add(conn, age=5, cancel_requested=True)
    expired = add(conn, age=4, expires_at=NOW)
    alive = add(conn, age=3, expires_at=NOW + timedelta(seconds=1))
    not_due = add(conn, age=-3, cancel_requested=True)
    seen: list[tuple[int, str, str]] = []
    app = Akadze("postgresql://x@localhost/x")
    app.on_transition(lambda c, job, old, new: seen.append((job.id, old, new)))
    assert ids(claim_fn(conn, queue="q", slots=5, now=NOW, app=app)) == [alive]
    rows = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT id, state::text, finished_at FROM akadze.jobs"
    ).fetchall()}
    assert rows[asked] == ("cancelled", NOW) and rows[expired] == ("cancelled", NOW)
    assert rows[not_due] == ("queued", None)
    assert sorted(seen) == sorted([(asked, "queued", "cancelled"), (expired, "queued", "cancelled"),
                                   (alive, "queued", "running")])


@CLAIMS
def test_paused_queue_is_left_alone(conn: Conn, claim_fn: Callable[..., Any]) -> None:
    add(conn)
    add(conn, cancel_requested=True)
    conn.execute("INSERT INTO akadze.queue_pauses (queue) VALUES ('q')")
    assert claim_fn(conn, queue="q", slots=5, now=NOW) == []
    states = {r[0] for r in conn.execute("SELECT state::text FROM akadze.jobs")}
    assert states == {"queued"}


@CLAIMS
def test_tasks_filter(conn: Conn, claim_fn: Callable[..., Any]) -> None:
    add(conn, task="a", age=3)
    b = add(conn, task="b", age=2)
    assert ids(claim_fn(conn, queue="q", slots=5, tasks=["b", "c"], now=NOW)) == [b]


@CLAIMS
def test_fair_turns(conn: Conn, claim_fn: Callable[..., Any]) -> None:
    # group "big" has a long backlog first and one running job; "small" and the
    # null group get their turns before big's second job
    add(conn, key="big", state="running")
    big = [add(conn, key="big", age=100 - i) for i in range(5)]
    small = [add(conn, key="small", age=50 - i) for i in range(2)]
    none = add(conn, age=10)
    urgent = add(conn, key="big", priority=1, age=1)
    got = ids(claim_fn(conn, queue="q", slots=5, fair=True, now=NOW))
    # urgent: priority first. Then turns: small#1 (1), none (1), big#1 (2), small#2 (2), ...
    assert got == [urgent, small[0], none, big[0], small[1]]


@CLAIMS
def test_replans_around_rows_another_transaction_holds(
    conn: Conn, database_url: str, claim_fn: Callable[..., Any]
) -> None:
    first, second, third = (add(conn, age=3 - i) for i in range(3))
    with psycopg.connect(database_url) as other:
        other.execute("SELECT 1 FROM akadze.jobs WHERE id = %s FOR UPDATE", (first,))
        assert ids(claim_fn(conn, queue="q", slots=2, now=NOW)) == [second, third]
        other.rollback()


@CLAIMS
def test_limited_key_held_by_another_claim_is_left_out(
    conn: Conn, database_url: str, claim_fn: Callable[..., Any]
) -> None:
    # the claim locks "first" (free); "k" is held elsewhere, so it is skipped, not waited for
    limit(conn, "first", max_running=5)
    limit(conn, "k", max_running=5)
    head = add(conn, key="first", age=9)
    add(conn, key="k", age=5)
    free = add(conn, age=1)
    with psycopg.connect(database_url) as other:
        other.execute("SELECT 1 FROM akadze.limits WHERE key = 'k' FOR UPDATE")
        assert ids(claim_fn(conn, queue="q", slots=3, now=NOW)) == [head, free]
        other.rollback()


def test_first_lock_waits_and_then_counts_what_the_holder_committed(
    conn: Conn, database_url: str
) -> None:
    limit(conn, "k", max_running=1)
    first = add(conn, key="k", age=9)
    second = add(conn, key="k", age=8)
    with psycopg.connect(database_url) as other:
        # another claim holds "k" and starts `first`
        other.execute("SELECT 1 FROM akadze.limits WHERE key = 'k' FOR UPDATE")
        other.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = %s", (first,))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(claim, conn, queue="q", slots=2, now=NOW)
            deadline = time.monotonic() + 10
            while not _waiting_on_lock(database_url):
                assert time.monotonic() < deadline, "the claim never waited for the lock"
                time.sleep(0.01)
            assert not pending.done()
            other.commit()
            # the claim saw the commit: k is at its limit, nothing to claim
            assert pending.result(timeout=10) == []
    assert ids(claim(conn, queue="q", slots=2, now=NOW)) == []
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded' WHERE id = %s", (first,))
    assert ids(claim(conn, queue="q", slots=2, now=NOW)) == [second]


def _waiting_on_lock(database_url: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


@CLAIMS
async def test_async_connection(
    aconn: psycopg.AsyncConnection[Any], claim_fn: Callable[..., Any]
) -> None:
    await aconn.execute(
        "INSERT INTO akadze.jobs (queue, task, run_at) VALUES ('q', 't', %s)", (NOW,)
    )
    seen: list[str] = []
    app = Akadze("postgresql://x@localhost/x")

    @app.on_transition
    async def hook(c: Any, job: Any, old: str, new: str) -> None:
        seen.append(new)

    got = await claim_fn(aconn, queue="q", slots=3, worker_id="w", now=NOW, app=app)
    assert [j.attempt for j in got] == [1] and seen == ["running"]


def test_bad_arguments(conn: Conn) -> None:
    with pytest.raises(ConfigurationError):
        claim(conn, queue="", slots=1)
    with pytest.raises(ConfigurationError):
        claim(conn, queue="q", slots=-1)
    with pytest.raises(ConfigurationError):
        claim(conn, queue="q", slots=1, tasks="t")
    assert claim(conn, queue="q", slots=0) == []
    with conn.transaction(), pytest.raises(ConfigurationError):
        claim(conn, queue="q", slots=1)


def test_a_connection_remembers_the_keys_its_last_claim_left_without_room(conn: Conn) -> None:
    from akadze.claim import memory

    limit(conn, "hot", max_running=1)
    limit(conn, "idle", max_running=1)
    running = add(conn, key="hot", state="running", age=100)
    hot = [add(conn, key="hot", age=50 - i) for i in range(3)]
    free = [add(conn, age=10 - i) for i in range(3)]
    assert ids(claim(conn, queue="q", slots=2, now=NOW)) == free[:2]
    # "idle" has room and no job here: only the key at its limit is remembered.
    assert memory.get(conn, "q").blocked == ("hot",)
    assert memory.get(conn, "other").blocked == ()
    # A hint, not a verdict: once the key has room again, the next claim on the
    # same connection counts it again and takes its job first.
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = %s WHERE id = %s",
                 (NOW, running))
    assert ids(claim(conn, queue="q", slots=2, now=NOW)) == [hot[0], free[2]]
    assert memory.get(conn, "q").blocked == ("hot",)  # at its limit again, by this claim
    conn.execute("DELETE FROM akadze.limits WHERE key = 'hot'")
    assert ids(claim(conn, queue="q", slots=5, now=NOW)) == hot[1:]
    assert memory.get(conn, "q").blocked == ()


@CLAIMS
@pytest.mark.parametrize("failure", ["python", "sql"])
def test_a_failing_claim_leaves_nothing_taken_and_the_connection_usable(
    conn: Conn, claim_fn: Callable[..., Any], failure: str
) -> None:
    job = add(conn)
    app = Akadze("postgresql://x@localhost/x")

    @app.on_transition
    def hook(c: Any, claimed: Any, old: str, new: str) -> None:
        if failure == "python":
            raise RuntimeError("hook broke")
        c.execute("SELECT 1 / 0")

    with pytest.raises((RuntimeError, psycopg.errors.DivisionByZero)):
        claim_fn(conn, queue="q", slots=1, now=NOW, app=app)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SELECT state::text, run_count FROM akadze.jobs").fetchall() == [
        ("queued", 0)]
    # The same connection claims normally afterwards.
    assert ids(claim_fn(conn, queue="q", slots=1, now=NOW)) == [job]


@CLAIMS
async def test_a_failing_async_claim_leaves_nothing_taken(
    aconn: psycopg.AsyncConnection[Any], claim_fn: Callable[..., Any]
) -> None:
    await aconn.execute(
        "INSERT INTO akadze.jobs (queue, task, run_at) VALUES ('q', 't', %s)", (NOW,))
    app = Akadze("postgresql://x@localhost/x")

    @app.on_transition
    async def hook(c: Any, job: Any, old: str, new: str) -> None:
        await c.execute("SELECT 1 / 0")

    with pytest.raises(psycopg.errors.DivisionByZero):
        await claim_fn(aconn, queue="q", slots=1, now=NOW, app=app)
    assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    cur = await aconn.execute("SELECT state::text FROM akadze.jobs")
    assert await cur.fetchall() == [("queued",)]
    assert len(await claim_fn(aconn, queue="q", slots=1, now=NOW)) == 1


def test_a_claim_runs_read_committed_whatever_the_sessions_default(conn: Conn) -> None:
    # The lock protocol needs READ COMMITTED (a new statement after a lock sees
    # the holder's commits); a role or server may default to another level.
    add(conn, key="k")
    limit(conn, "k", max_running=1)
    conn.execute("SET default_transaction_isolation = 'serializable'")
    seen: list[str] = []
    app = Akadze("postgresql://x@localhost/x")

    def record(c: Any, job: Any, old: str, new: str) -> None:
        row = c.execute("SELECT current_setting('transaction_isolation')").fetchone()
        assert row is not None
        seen.append(row[0])

    app.on_transition(record)
    assert len(claim(conn, queue="q", slots=5, app=app, now=NOW)) == 1
    assert seen == ["read committed"]
