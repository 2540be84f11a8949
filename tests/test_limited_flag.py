"""jobs.limited (migration 0005): a queued job with limited = true always has a
limits row, whatever path queued it and whatever set_limit / clear_limit ran
meanwhile; the claim reads the two parts of the queue from it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from akadze import Akadze, Job, LimitError, queries
from akadze.bench import queries as harness
from akadze.claim import claim, claim_oracle
from akadze.claim._steps import key_list
from akadze.control import requeue_sync
from akadze.limits import clear_limit_sync, set_limit_sync

Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def work(app: Akadze) -> Any:
    @app.task("work")
    def work() -> None:
        pass

    return work


def _flags(conn: Conn) -> dict[int, bool]:
    rows = conn.execute("SELECT id, limited FROM akadze.jobs ORDER BY id").fetchall()
    return {int(r[0]): bool(r[1]) for r in rows}


def _unclaim(conn: Conn, ids: list[int]) -> None:
    """Undo a claim exactly (the bench's restore), so the next claim meets the same queue."""
    conn.execute(harness.get("bench_restore"), {"ids": ids})


def _orphans(conn: Conn) -> int:
    """Queued jobs flagged limited without a limits row: the claim never reaches them."""
    row = conn.execute(
        "SELECT count(*) FROM akadze.jobs j WHERE j.state = 'queued' AND j.limited"
        " AND NOT EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = j.limit_key)").fetchone()
    assert row is not None
    return int(row[0])


def test_every_enqueue_path_flags_the_jobs_of_limited_keys(conn: Conn, work: Any) -> None:
    set_limit_sync(conn, "acme", max_running=1)
    one = work.using(limit_key="acme").enqueue_sync()
    free = work.using(limit_key="other").enqueue_sync()
    bare = work.using().enqueue_sync()
    many = work.using().enqueue_many_sync(
        [Job(limit_key="acme"), Job(limit_key="other"), Job()])
    flags = _flags(conn)
    assert [flags[i] for i in (one, free, bare, *many)] == [True, False, False, True, False, False]


def test_set_limit_flags_queued_jobs_and_clear_limit_unflags_them(conn: Conn, work: Any) -> None:
    queued = work.using(limit_key="acme").enqueue_sync()
    other = work.using(limit_key="beta").enqueue_sync()
    assert _flags(conn) == {queued: False, other: False}
    set_limit_sync(conn, "acme", max_running=2)
    assert _flags(conn) == {queued: True, other: False}
    set_limit_sync(conn, "acme", max_running=3)  # a change of an existing limit
    assert _flags(conn) == {queued: True, other: False}
    assert clear_limit_sync(conn, "acme") is True
    assert _flags(conn) == {queued: False, other: False}
    assert _orphans(conn) == 0


def test_a_job_queued_again_takes_its_flag_from_the_limits_of_now(
        conn: Conn, work: Any, app: Akadze) -> None:
    job = work.using(limit_key="acme").enqueue_sync()
    conn.execute("UPDATE akadze.jobs SET state = 'failed', finished_at = now() WHERE id = %s",
                 [job])
    set_limit_sync(conn, "acme", max_running=1)
    requeue_sync(conn, job, app=app)
    assert _flags(conn)[job] is True
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = %s", [job])
    clear_limit_sync(conn, "acme")
    # still flagged while running (clear_limit only unflags queued jobs) ...
    assert _flags(conn)[job] is True
    conn.execute("UPDATE akadze.jobs SET state = 'queued' WHERE id = %s", [job])
    # ... and unflagged once queued again, by the trigger
    assert _flags(conn)[job] is False
    assert _orphans(conn) == 0


def test_clear_limit_waits_for_an_open_enqueue_and_unflags_its_job(
        conn: Conn, work: Any, database_url: str) -> None:
    set_limit_sync(conn, "acme", max_running=1)
    with psycopg.connect(database_url) as app_conn:  # an application's open transaction
        job = work.using(session=app_conn, limit_key="acme").enqueue_sync()
        done = threading.Event()
        failure: list[BaseException] = []

        def clear() -> None:
            try:
                with psycopg.connect(database_url, autocommit=True) as admin:
                    clear_limit_sync(admin, "acme")
            except BaseException as exc:  # reported below
                failure.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=clear)
        thread.start()
        # clear_limit's DELETE waits on the FOR KEY SHARE lock of the enqueue:
        # wait until the server shows it waiting on a lock.
        with psycopg.connect(database_url, autocommit=True) as watch:
            for _ in range(500):
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM akadze.limits%%'"
                ).fetchone()
                if row and row[0]:
                    break
                done.wait(0.02)
            else:
                pytest.fail("clear_limit never waited for the open enqueue")
        assert not done.is_set()
        app_conn.commit()
    assert done.wait(10)
    thread.join()
    assert not failure
    assert _flags(conn)[job] is False
    assert _orphans(conn) == 0
    assert [j.id for j in claim(conn, queue="default", slots=5)] == [job]


def test_a_claim_is_not_held_up_by_an_open_enqueue_of_the_key(
        conn: Conn, work: Any, database_url: str) -> None:
    set_limit_sync(conn, "acme", max_running=1)
    first = work.using(limit_key="acme").enqueue_sync()
    with psycopg.connect(database_url) as app_conn:  # holds FOR KEY SHARE on acme's row
        work.using(session=app_conn, limit_key="acme").enqueue_sync()
        # lock_timeout: a claim that waited on the row would fail instead of hanging
        conn.execute("SET lock_timeout = '2s'")
        assert [j.id for j in claim(conn, queue="default", slots=5)] == [first]
        app_conn.rollback()


def test_clear_limit_refuses_a_stricter_isolation_and_changes_nothing(
        database_url: str, conn: Conn, work: Any) -> None:
    set_limit_sync(conn, "acme", max_running=1)
    job = work.using(limit_key="acme").enqueue_sync()
    with psycopg.connect(database_url) as rr:
        rr.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(LimitError, match="READ COMMITTED"):
            clear_limit_sync(rr, "acme")
        rr.rollback()
    assert conn.execute("SELECT count(*) FROM akadze.limits").fetchone() == (1,)
    assert _flags(conn)[job] is True


@pytest.mark.parametrize("fair", [False, True])
def test_keys_at_their_limit_ahead_of_free_ones(conn: Conn, work: Any, fair: bool) -> None:
    """Many keys at their limit lead the queue (the claim reads split); after
    clear_limit of one of them, its jobs are claimable again at once."""
    keys = [f"busy{i}" for i in range(40)]
    for key in keys:
        set_limit_sync(conn, key, max_running=1)
    conn.execute(
        "INSERT INTO akadze.jobs (queue, task, state, limit_key) "
        "SELECT 'default', 'work', 'running', k FROM unnest(%s::text[]) k", [keys])
    work.using().enqueue_many_sync(
        [Job(limit_key=keys[i % 40]) for i in range(400)]
        + [Job(limit_key=f"free{i}") for i in range(30)])
    for _ in range(2):  # the second claim starts from what the first remembered
        expected = [j.id for j in claim_oracle(conn, queue="default", slots=20, fair=fair)]
        _unclaim(conn, expected)
        got = [j.id for j in claim(conn, queue="default", slots=20, fair=fair)]
        assert got == expected
        _unclaim(conn, got)
    clear_limit_sync(conn, "busy7")
    expected = [j.id for j in claim_oracle(conn, queue="default", slots=20, fair=fair)]
    _unclaim(conn, expected)
    got = claim(conn, queue="default", slots=20, fair=fair)
    assert [j.id for j in got] == expected
    if not fair:  # (fair turns put the 30 idle groups ahead of busy7, which runs a job)
        assert "busy7" in {j.limit_key for j in got}


def test_the_window_function_is_inlined_into_the_window_statements(conn: Conn) -> None:
    """akadze.ready_window_open (migration 0018), which the window statements call,
    must be inlined (LANGUAGE sql, STABLE, a single SELECT): called as functions, their
    bodies would be planned at every claim."""
    params = {"queue": "q", "after_priority": 32768,
              "after_run_at": datetime(1970, 1, 1, tzinfo=UTC), "after_id": 0, "now": None,
              "skip_free": key_list(["a"]), "skip_limited": key_list(["a", "b"]),
              "skip_null": False, "remembered": key_list(["b", "c"]),
              "remembered_free": key_list(["c"]),
              "window": 40, "split_max": 32, "need": None, "known": [], "known_null": False,
              "try_open": True, "known_open": None,
              "fair": False, "tasks": None}
    for name in ("claim_window", "claim_window_whole", "claim_window_judged"):
        with conn.transaction():
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            plan = "\n".join(r[0] for r in conn.execute(
                sql.SQL("EXPLAIN ") + queries.get(name), params).fetchall())
        assert "Function Scan" not in plan, name
        assert "jobs_ready_free_idx" in plan and "jobs_ready_limited_idx" in plan, name


def test_a_limits_row_deleted_by_hand_unflags_its_jobs(conn: Conn, work: Any) -> None:
    set_limit_sync(conn, "acme", max_running=1)
    job = work.using(limit_key="acme").enqueue_sync()
    assert _flags(conn)[job] is True
    conn.execute("DELETE FROM akadze.limits WHERE key = 'acme'")
    assert _flags(conn)[job] is False
    assert [j.id for j in claim(conn, queue="default", slots=5)] == [job]


def test_flags_stay_true_to_the_limits_under_concurrent_churn(
        conn: Conn, work: Any, database_url: str) -> None:
    """Enqueuers, a thread that sets and clears the keys' limits, and a claimer run
    at once; afterwards no queued job is flagged without a limits row, and once
    every limit is gone every job can be claimed."""
    keys = [f"k{i}" for i in range(4)]
    failures: list[BaseException] = []
    go = threading.Barrier(4)

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                go.wait(10)
                fn()
            except BaseException as exc:  # reported below
                failures.append(exc)
        return run

    def enqueue() -> None:
        with psycopg.connect(database_url) as c:
            for i in range(120):
                if i % 3 == 0:
                    work.using(session=c).enqueue_many_sync(
                        [Job(limit_key=keys[(i + n) % 4]) for n in range(5)])
                else:
                    work.using(session=c, limit_key=keys[i % 4]).enqueue_sync()
                if i % 4 == 3:  # transactions stay open across a few enqueues
                    c.commit()
            c.commit()

    seen_orphans: list[int] = []

    def churn() -> None:
        with psycopg.connect(database_url, autocommit=True) as c:
            for i in range(160):
                key = keys[i % 4]
                if (i // 4) % 2 == 0:
                    set_limit_sync(c, key, max_running=1 + i % 3)
                else:
                    clear_limit_sync(c, key)
                # every committed state keeps the rule, not only the last one
                seen_orphans.append(_orphans(c))

    def claim_some() -> None:
        with psycopg.connect(database_url, autocommit=True) as c:
            for _ in range(120):
                got = claim(c, queue="default", slots=3)
                if got:
                    c.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()"
                              " WHERE id = ANY (%s)", [[j.id for j in got]])

    threads = [threading.Thread(target=guarded(f)) for f in (enqueue, enqueue, churn, claim_some)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert max(seen_orphans) == 0 and _orphans(conn) == 0
    for key in keys:
        clear_limit_sync(conn, key)
    queued = conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = 'queued'").fetchone()
    assert queued is not None and queued[0] > 0
    taken = 0
    while got := claim(conn, queue="default", slots=50):
        taken += len(got)
    assert taken == queued[0]


def _judged_lists(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], list[str], list[str]]]:
    """(remembered, remembered_free, the keys it left out) of every judged first
    window (claim_window_judged) the claims read meanwhile."""
    from akadze.claim import _windows

    seen: list[tuple[list[str], list[str], list[str]]] = []
    opening = _windows._start_with_state

    def recorded(request: Any, known: Any, reading: Any, first_size: int) -> Any:
        steps = opening(request, known, reading, first_size)
        batch = next(steps)
        window = next(st for st in batch.statements if st.params and "remembered" in st.params)
        try:
            reply = yield batch
            left = next((r[12] for r in reply[2] if r[0] is None and r[12] is not None), [])
            seen.append((sorted(window.params["remembered"].obj),
                         sorted(window.params["remembered_free"].obj), sorted(left)))
            steps.send(reply)
        except StopIteration as done:
            return done.value
        raise AssertionError("the judged opening is one round trip")

    monkeypatch.setattr(_windows, "_start_with_state", recorded)
    return seen


@pytest.mark.parametrize("stale", [False, True])
def test_keys_at_their_limit_are_left_out_of_the_part_that_holds_their_jobs(
        conn: Conn, work: Any, monkeypatch: pytest.MonkeyPatch, stale: bool) -> None:
    """Migrations 0014, 0016 and 0018: a key at its limit whose jobs are flagged is
    never read (the open route reads the limited part for the keys with room); one
    whose jobs the claim met unflagged (queued before its limit) is left out of the
    free part from the next claim's first window on, which judges on the server which
    remembered keys are still without room. Either way the claim is the reference
    claim's."""
    blocked = [f"b{i:02d}" for i in range(20)]
    for key in blocked:
        set_limit_sync(conn, key, max_running=1)
    # flagged, as a claim starts the run of a key with a limits row (0017)
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, state, limited) "
                 "SELECT 'elsewhere', 'work', k, 'running', true FROM unnest(%s::text[]) k",
                 (blocked,))
    work.using().enqueue_many_sync(
        [Job(limit_key=blocked[i % 20]) for i in range(200)]
        # free keys enough that the claim reads windows, not per group
        + [Job(limit_key=f"free{i:02d}") for i in range(30)])
    if stale:
        conn.execute("UPDATE akadze.jobs SET limited = false WHERE state = 'queued'")
    judged = _judged_lists(monkeypatch)
    for _ in range(2):
        expected = [j.id for j in claim_oracle(conn, queue="default", slots=20)]
        _unclaim(conn, expected)
        got = [j.id for j in claim(conn, queue="default", slots=20)]
        assert got == expected
        _unclaim(conn, got)
    if not stale:
        # the open route (migration 0018): the windows read the limited part for
        # the keys with room only, so the claims never meet the keys at their
        # limit, and nothing is remembered of them to judge
        assert judged == []
        return
    # the second claim's first window leaves out of the free part the keys it
    # met there without room, judged on the server (claim_window_judged,
    # migrations 0016 and 0018)
    assert len(judged) == 1
    remembered, remembered_free, left_out = judged[0]
    assert remembered == sorted(blocked)
    assert remembered_free == sorted(blocked)
    assert left_out == sorted(blocked)
