"""limits.running (migration 0017): every limits row counts its key's running jobs
that are flagged limited, in the same transaction as each change to them, whatever
path started, ended, moved or removed them; and a run of a key with a limits row
is always flagged, so the count is the key's running jobs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from worker_support import eventually

from akadze import outcomes, queries
from akadze.claim import claim
from akadze.jobs import JobState
from akadze.limits import clear_limit_sync, set_limit_sync
from akadze.worker._finishes import write

Conn = psycopg.Connection[tuple[Any, ...]]

KEYS = ("a", "b", "c")
QUEUE = "q"


def _counts(conn: Conn) -> list[tuple[str, int, int]]:
    """Each limits row: its count, and its key's running jobs flagged limited."""
    return [(str(r[0]), int(r[1]), int(r[2])) for r in conn.execute(
        "SELECT l.key, l.running, (SELECT count(*) FROM akadze.jobs r WHERE r.state ="
        " 'running' AND r.limited AND r.limit_key = l.key) FROM akadze.limits l"
        " ORDER BY l.key").fetchall()]


def _mismatches(conn: Conn) -> list[tuple[str, int, int]]:
    """Limits rows whose count is not their key's flagged running jobs."""
    return [c for c in _counts(conn) if c[1] != c[2]]


def _count(conn: Conn, key: str) -> int:
    """The count the limits row of ``key`` keeps."""
    return next(running for k, running, _ in _counts(conn) if k == key)


def _overcounts(conn: Conn) -> list[tuple[str, int, int]]:
    """Limits rows counting more than their key's running jobs: never allowed."""
    return [c for c in _counts(conn) if c[1] > c[2]]


def _unflagged_runs(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM akadze.jobs j JOIN akadze.limits l ON l.key = j.limit_key"
        " WHERE j.state = 'running' AND NOT j.limited").fetchone()
    assert row is not None
    return int(row[0])


def _enqueue(conn: Conn, key: str | None, n: int) -> None:
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, limit_key, limited)"
        " SELECT %s, 't', %s, EXISTS (SELECT 1 FROM akadze.limits WHERE key = %s)"
        " FROM generate_series(1, %s)", (QUEUE, key, key, n))


def _start(conn: Conn, n: int) -> None:
    """What a hand-off's take does to the rows: start n queued jobs, flagged when
    their key has a limits row (the run_start fragment)."""
    conn.execute(
        "UPDATE akadze.jobs j SET state = 'running', started_at = now(),"
        " limited = EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = j.limit_key)"
        " WHERE id IN (SELECT id FROM akadze.jobs WHERE state = 'queued'"
        " ORDER BY id LIMIT %s)", (n,))


def _end(conn: Conn, state: str, n: int) -> None:
    """What outcome writes do: end (or requeue) n running jobs in one statement."""
    conn.execute(
        "UPDATE akadze.jobs SET state = %s::akadze.job_state,"
        " finished_at = CASE WHEN %s = 'queued' THEN NULL ELSE now() END"
        " WHERE id IN (SELECT id FROM akadze.jobs WHERE state = 'running'"
        " ORDER BY limited DESC, id DESC LIMIT %s)", (state, state, n))


_enqueues = st.tuples(st.just("enqueue"), st.sampled_from((*KEYS, "a", "b", None)),
                      st.integers(1, 4))
_claims = st.tuples(st.just("claim"), st.booleans(), st.integers(1, 5))
_ends = st.tuples(st.just("end"), st.sampled_from(("succeeded", "failed", "cancelled",
                                                   "queued")), st.integers(1, 4))
# Claims, enqueues and ends drawn three times as often as the rest, so that
# most examples have runs of limited keys to count.
operations = st.lists(st.one_of(
    _enqueues, _enqueues, _enqueues, _claims, _claims, _claims, _ends, _ends,
    st.tuples(st.just("set"), st.sampled_from(KEYS), st.integers(1, 3)),
    st.tuples(st.just("set"), st.sampled_from(KEYS), st.integers(1, 3)),
    st.tuples(st.just("clear"), st.sampled_from(KEYS)),
    st.tuples(st.just("delete_running"), st.integers(1, 2)),
    st.tuples(st.just("insert_running"), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("rekey"), st.sampled_from(KEYS)),
    st.tuples(st.just("truncate"),),
    # A hand-off's write: runs end, then jobs start, in one transaction whose
    # count changes are kept and applied at its end (migration 0021).
    st.tuples(st.just("deferred"), st.lists(st.one_of(
        st.tuples(st.just("end"), st.sampled_from(("succeeded", "failed", "queued")),
                  st.integers(1, 3)),
        st.tuples(st.just("start"), st.integers(1, 3))), min_size=1, max_size=4)),
), min_size=8, max_size=30)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_the_count_follows_every_change_of_a_running_job(conn: Conn, ops: list[Any]) -> None:
    conn.execute("TRUNCATE akadze.jobs CASCADE")
    conn.execute("DELETE FROM akadze.limits")
    set_limit_sync(conn, "a", max_running=3)
    set_limit_sync(conn, "b", max_running=2)
    for number, op in enumerate(ops):
        kind = op[0]
        if kind == "set":
            set_limit_sync(conn, op[1], max_running=op[2])
        elif kind == "clear":
            clear_limit_sync(conn, op[1])
        elif kind == "enqueue":
            _enqueue(conn, op[1], op[2])
        elif kind == "claim":
            claim(conn, queue=QUEUE, slots=op[2], fair=op[1], worker_id="w")
        elif kind == "end":
            _end(conn, op[1], op[2])
        elif kind == "delete_running":
            conn.execute("DELETE FROM akadze.jobs WHERE id IN (SELECT id FROM akadze.jobs"
                         " WHERE state = 'running' ORDER BY limited DESC, id LIMIT %s)",
                         (op[1],))
        elif kind == "insert_running":
            # Written by hand, flagged or not: counted exactly when flagged.
            conn.execute("INSERT INTO akadze.jobs (queue, task, state, limit_key, limited,"
                         " started_at) VALUES (%s, 't', 'running', %s, %s AND EXISTS ("
                         "SELECT 1 FROM akadze.limits WHERE key = %s), now())",
                         (QUEUE, op[1], op[2], op[1]))
        elif kind == "deferred":
            with conn.transaction():
                conn.execute(queries.get("defer_running"))
                for step in op[1]:
                    if step[0] == "end":
                        _end(conn, step[1], step[2])
                    else:
                        _start(conn, step[1])
                conn.execute(queries.get("apply_running"))
        elif kind == "rekey":
            # A limits row renamed by hand: it counted the old key's jobs.
            conn.execute("UPDATE akadze.limits SET key = %s WHERE key = %s",
                         (f"{op[1]}-{number}", op[1]))
        else:
            conn.execute("TRUNCATE akadze.jobs CASCADE")
        # Never more than the key's flagged runs, whatever happened; exactly
        # that many unless a row was deleted or renamed in the example (runs
        # flagged under the old row are not in a new row's count).
        assert _overcounts(conn) == [], op
        if not any(o[0] in ("clear", "rekey") for o in ops[:number + 1]):
            assert _mismatches(conn) == [], op
    # Every run a claim started of a key with a limits row is flagged; unflagged
    # runs of such keys come only from rows written by hand, or from runs that
    # began before their key's row (a, b exist from the start; c does not).
    hand = any(op[0] in ("insert_running", "rekey", "clear") or op[:2] == ("set", "c")
               for op in ops)
    if not hand:
        assert _unflagged_runs(conn) == 0


def test_a_claim_flags_a_run_queued_before_its_key_had_a_limit(conn: Conn) -> None:
    _enqueue(conn, "late", 2)
    # set_limit of a new key flags its queued jobs; here the key's jobs were
    # queued with the flag false and the limit came by hand, as an old version
    # would leave them.
    conn.execute("INSERT INTO akadze.limits (key, max_running) VALUES ('late', 5)")
    assert conn.execute("SELECT bool_or(limited) FROM akadze.jobs").fetchone() == (False,)
    got = claim(conn, queue=QUEUE, slots=1, fair=False, worker_id="w")
    assert len(got) == 1
    assert _count(conn, "late") == 1
    _end(conn, "succeeded", 1)
    assert _count(conn, "late") == 0


def test_a_new_row_counts_from_zero_and_never_goes_below(conn: Conn) -> None:
    """set_limit of a new key counts none of the key's runs (they are unflagged,
    or flagged under an earlier row): lower than the truth, never higher; runs
    that start under the row are counted, and the count stays at 0 or more."""
    _enqueue(conn, "k", 4)
    assert len(claim(conn, queue=QUEUE, slots=2, fair=False, worker_id="w")) == 2
    set_limit_sync(conn, "k", max_running=5)
    assert _count(conn, "k") == 0
    assert len(claim(conn, queue=QUEUE, slots=1, fair=False, worker_id="w")) == 1
    assert _count(conn, "k") == 1
    # the flagged run stays flagged while it runs; a row created again counts 0
    assert clear_limit_sync(conn, "k")
    set_limit_sync(conn, "k", max_running=5)
    assert _count(conn, "k") == 0
    _end(conn, "succeeded", 3)
    assert _count(conn, "k") == 0
    assert _overcounts(conn) == []


def test_finishes_and_claims_of_the_same_keys_never_deadlock(database_url: str) -> None:
    """Writers of the same keys whose rows come in opposite key orders: each
    statement's counts are applied in key order, so none waits in a cycle (a
    deadlock would raise). (Two statements of one transaction lock two sets one
    after the other; the outcome write locks its keys first for that:
    test_a_mixed_outcome_write_locks_its_keys_in_key_order.)"""
    keys = [f"k{i}" for i in range(8)]
    with psycopg.connect(database_url, autocommit=True) as setup:
        for key in keys:
            set_limit_sync(setup, key, max_running=1000)
        setup.execute(
            "INSERT INTO akadze.jobs (queue, task, limit_key, limited)"
            " SELECT %s, 't', 'k' || (g %% 8), true FROM generate_series(1, 4000) g",
            (QUEUE,))
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def claimer() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as c:
                start.wait()
                for _ in range(60):
                    claim(c, queue=QUEUE, slots=10, fair=False, worker_id="w")
        except BaseException as exc:
            errors.append(exc)

    def finisher(order: str) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as c:
                start.wait()
                for _ in range(60):
                    # One statement, its rows locked (and changed) in ascending or
                    # descending key order.
                    c.execute(
                        "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
                        " WHERE id IN (SELECT id FROM akadze.jobs WHERE state = 'running'"
                        " ORDER BY limit_key " + ("ASC" if order == "up" else "DESC")
                        + ", id LIMIT 8 FOR UPDATE SKIP LOCKED)")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer), threading.Thread(target=claimer),
               threading.Thread(target=finisher, args=("up",)),
               threading.Thread(target=finisher, args=("down",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    with psycopg.connect(database_url, autocommit=True) as check:
        assert _mismatches(check) == []


def _one_run_each(conn: Conn, *, max_running: int, queued: int) -> dict[str | None, Any]:
    """Keys a and b with ``max_running``, ``queued`` jobs each, and one run of each
    started by a claim: the runs by key."""
    for key in ("a", "b"):
        set_limit_sync(conn, key, max_running=max_running)
        _enqueue(conn, key, queued)
    jobs = {j.limit_key: j for j in claim(conn, queue=QUEUE, slots=2, fair=False,
                                          worker_id="w")}
    assert set(jobs) == {"a", "b"}
    return jobs


async def test_a_mixed_outcome_write_locks_its_keys_in_key_order(
    database_url: str, conn: Conn, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """An outcome write of more than one statement (a run of key b succeeded, one of
    key a failed: finish_succeeded, then finish_jobs) locks both keys' limits rows
    first, in key order. While another transaction holds a's row, the write waits
    for it holding nothing: b's row stays free. Statement by statement, it would
    hold b's row while it waits for a's, and beside a write with the kinds the
    other way round, each would wait for the other (a deadlock)."""
    jobs = _one_run_each(conn, max_running=5, queued=1)
    batch = [outcomes.Finish(jobs["b"], outcomes.SUCCEEDED, JobState.SUCCEEDED, result="1"),
             outcomes.Finish(jobs["a"], outcomes.FAILED, JobState.FAILED)]
    pid = aconn.info.backend_pid
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM akadze.limits WHERE key = 'a' FOR NO KEY UPDATE")
        writing = asyncio.create_task(write(aconn, batch))
        try:
            await eventually(lambda: conn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                (pid,)).fetchone() == (True,), what="the write to wait for a's row")
            with psycopg.connect(database_url) as other, other.transaction():
                assert other.execute(
                    "SELECT key FROM akadze.limits WHERE key = 'b'"
                    " FOR NO KEY UPDATE NOWAIT").fetchall() == [("b",)]
        finally:
            holder.rollback()
            accepted = await asyncio.wait_for(writing, 30)
    assert accepted == {jobs["a"].id, jobs["b"].id}
    assert _mismatches(conn) == []
    assert _count(conn, "a") == _count(conn, "b") == 0


def _version(conn: Conn, key: str) -> str:
    """The transaction that wrote the current version of ``key``'s limits row."""
    row = conn.execute("SELECT xmin::text FROM akadze.limits WHERE key = %s",
                       (key,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_a_hand_off_write_changes_each_count_once_by_its_net(
    conn: Conn, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """An outcome write that hands slots off (``then``: the next jobs start in the
    same transaction) writes each key's count once, by the net change: a key
    whose run ended and whose next job started there keeps its limits row as it
    was (no new version), a key whose run ended without a next one is counted
    down, and every count is exact after the commit."""
    jobs = _one_run_each(conn, max_running=1, queued=2)
    assert (_count(conn, "a"), _count(conn, "b")) == (1, 1)
    before = _version(conn, "a")

    async def then(c: psycopg.AsyncConnection[Any]) -> Any:
        # the hand-off of a's slot: a's next job starts in the same transaction
        cur = await c.execute(
            "UPDATE akadze.jobs SET state = 'running', started_at = now(), worker_id = 'w'"
            " WHERE id = (SELECT id FROM akadze.jobs WHERE state = 'queued'"
            " AND limit_key = 'a' ORDER BY id LIMIT 1) RETURNING id")

        async def read() -> None:
            assert len(await cur.fetchall()) == 1

        return read

    batch = [outcomes.Finish(jobs[key], outcomes.SUCCEEDED, JobState.SUCCEEDED, result="1")
             for key in ("a", "b")]
    assert await write(aconn, batch, then=then) == {jobs["a"].id, jobs["b"].id}
    assert _mismatches(conn) == []
    assert (_count(conn, "a"), _count(conn, "b")) == (1, 0)
    assert _version(conn, "a") == before, "a's count was written though it did not change"
    # the deferral ended with the write: the next statement counts at once
    _end(conn, "succeeded", 1)
    assert _count(conn, "a") == 0
    assert _mismatches(conn) == []


async def test_a_hand_off_write_that_fails_midway_commits_nothing(
    conn: Conn, aconn: psycopg.AsyncConnection[Any]
) -> None:
    """What raises in the client between a write's statements (a cancellation, an
    error of ours) rolls the whole write back: leaving a pipeline sends its Sync
    anyway, and an implicit transaction would commit the finishes sent so far,
    with their count changes kept and never applied. The connection is left idle."""
    set_limit_sync(conn, "a", max_running=1)
    _enqueue(conn, "a", 2)
    [job] = claim(conn, queue=QUEUE, slots=1, fair=False, worker_id="w")

    async def then(c: psycopg.AsyncConnection[Any]) -> Any:
        await c.execute("UPDATE akadze.jobs SET state = 'running' WHERE state = 'queued'")
        raise RuntimeError("between two statements")

    batch = [outcomes.Finish(job, outcomes.SUCCEEDED, JobState.SUCCEEDED, result="1")]
    with pytest.raises(RuntimeError, match="between two statements"):
        await write(aconn, batch, then=then)
    assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    states = conn.execute("SELECT state::text FROM akadze.jobs ORDER BY id").fetchall()
    assert states == [("running",), ("queued",)]
    assert _mismatches(conn) == [] and _count(conn, "a") == 1
    # the connection still writes
    assert await write(aconn, batch) == {job.id}
    assert _count(conn, "a") == 0


@pytest.mark.parametrize("flagged", [True, False])
def test_the_judged_window_leaves_out_only_keys_at_their_limit(
        conn: Conn, flagged: bool) -> None:
    """The first window of a claim remembering keys without room judges them by
    the count (claim_window_judged); a key whose runs are not counted (unflagged,
    written by hand) is read and counted the old way: never left out wrongly."""
    keys = [f"b{i}" for i in range(20)]
    for key in keys:
        set_limit_sync(conn, key, max_running=1)
        _enqueue(conn, key, 2)
        conn.execute("INSERT INTO akadze.jobs (queue, task, state, limit_key, limited,"
                     " started_at) VALUES (%s, 't', 'running', %s, %s, now())",
                     (QUEUE, key, flagged))
    _enqueue(conn, None, 30)
    first = claim(conn, queue=QUEUE, slots=5, fair=False, worker_id="w")
    second = claim(conn, queue=QUEUE, slots=5, fair=False, worker_id="w")
    assert all(job.limit_key is None for job in first + second)
    assert len(first) == len(second) == 5
