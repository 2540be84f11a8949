"""Uniqueness over time: unique_for, on_duplicate raise/ignore/replace, keep_run_at, in
enqueue_many too, requeue, and enqueues racing on one key from many threads."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze import Akadze, DuplicateJob, EnqueueError, Job, requeue_sync


@pytest.fixture
def hello(app: Akadze) -> Any:
    @app.task("hello")
    def hello(name: str, n: int = 0) -> None:
        pass

    return hello


def _finish(conn: Any, job_id: int, state: str = "succeeded", ago: timedelta = timedelta(0)
            ) -> None:
    conn.execute("UPDATE akadze.jobs SET state = %s, finished_at = now() - %s WHERE id = %s",
                 (state, ago, job_id))


def _jobs(conn: Any, key: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, state::text, args->>'name', run_at FROM akadze.jobs WHERE unique_key = %s "
        "ORDER BY id", (key,)).fetchall()


def test_raise_is_the_default_and_names_the_holder(conn: Any, hello: Any) -> None:
    first = hello.using(unique_key="k").enqueue_sync(name="a")
    with pytest.raises(DuplicateJob) as refused:
        hello.using(unique_key="k").enqueue_sync(name="b")
    assert refused.value.job_id == first and refused.value.field == "unique_key"
    assert str(first) in str(refused.value)
    assert [row[0] for row in _jobs(conn, "k")] == [first]


def test_unique_for_holds_the_key_after_the_job_finished(conn: Any, hello: Any) -> None:
    first = hello.using(unique_key="k").enqueue_sync(name="a")
    _finish(conn, first, ago=timedelta(minutes=10))
    # without a period, a finished job holds nothing
    second = hello.using(unique_key="k").enqueue_sync(name="b")
    _finish(conn, second, "failed", ago=timedelta(minutes=10))
    with pytest.raises(DuplicateJob) as refused:
        hello.using(unique_key="k", unique_for=timedelta(hours=1)).enqueue_sync(name="c")
    assert refused.value.job_id == second
    # a period shorter than the time since they finished: free again
    third = hello.using(unique_key="k", unique_for=300).enqueue_sync(name="d")
    assert [row[0] for row in _jobs(conn, "k")] == [first, second, third]
    assert hello.using(unique_key="k", unique_for=timedelta(hours=1),
                       on_duplicate="ignore").enqueue_sync(name="e") == third


def test_ignore_returns_the_holder_without_writing(conn: Any, hello: Any) -> None:
    first = hello.using(unique_key="k").enqueue_sync(name="a")
    assert hello.using(unique_key="k", on_duplicate="ignore").enqueue_sync(name="b") == first
    assert [(row[0], row[2]) for row in _jobs(conn, "k")] == [(first, "a")]


def test_replace_updates_the_queued_job_arguments_and_run_at(conn: Any, hello: Any) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    first = hello.using(unique_key="k", delay=60).enqueue_sync(name="a")
    assert hello.using(unique_key="k", on_duplicate="replace", run_at=later
                       ).enqueue_sync(name="b") == first
    [(job_id, state, name, run_at)] = _jobs(conn, "k")
    assert (job_id, state, name, run_at) == (first, "queued", "b", later)
    # throttle: the arguments only
    assert hello.using(unique_key="k", on_duplicate="replace", keep_run_at=True,
                       delay=5).enqueue_sync(name="c") == first
    assert _jobs(conn, "k") == [(first, "queued", "c", later)]


def test_replace_is_not_blocked_by_a_running_job(conn: Any, hello: Any) -> None:
    first = hello.using(unique_key="k").enqueue_sync(name="a")
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = %s", (first,))
    second = hello.using(unique_key="k", on_duplicate="replace").enqueue_sync(name="b")
    assert second != first
    # the queued one is now what a replace updates; ignore answers with it too
    assert hello.using(unique_key="k", on_duplicate="replace").enqueue_sync(name="c") == second
    assert hello.using(unique_key="k", on_duplicate="ignore").enqueue_sync(name="d") == second
    assert [(row[1], row[2]) for row in _jobs(conn, "k")] == [("running", "a"), ("queued", "c")]
    # "raise" is blocked by either
    with pytest.raises(DuplicateJob):
        hello.using(unique_key="k").enqueue_sync(name="e")
    # a finished holder within the period is not replaced: it answers
    _finish(conn, second)
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                 "WHERE id = %s", (first,))
    assert hello.using(unique_key="k", on_duplicate="replace", unique_for=60
                       ).enqueue_sync(name="f") == second


def test_bad_options_are_refused_before_any_statement(hello: Any) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"unique_for": 10}, "unique_key"),
        ({"on_duplicate": "ignore"}, "unique_key"),
        ({"unique_key": "k", "on_duplicate": "skip"}, "on_duplicate"),
        ({"unique_key": "k", "unique_for": -1}, "unique_for"),
        ({"unique_key": "k", "unique_for": "1h"}, "unique_for"),
        ({"unique_key": "k", "keep_run_at": True}, "keep_run_at"),
        ({"unique_key": "k", "on_duplicate": "replace", "keep_run_at": 1}, "keep_run_at"),
    ]
    for options, field in cases:
        with pytest.raises(EnqueueError) as refused:
            hello.using(**options)
        assert refused.value.field == field, options


def test_repeatable_read_is_refused(database_url: str, conn: Any, hello: Any) -> None:
    with psycopg.connect(database_url) as mine:
        mine.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(EnqueueError, match="READ COMMITTED"):
            hello.using(session=mine, unique_key="k").enqueue_sync(name="a")
        # the caller's transaction stays usable
        hello.using(session=mine).enqueue_sync(name="b")
        mine.commit()
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (1,)


def test_enqueue_many_with_keys(conn: Any, hello: Any) -> None:
    held = hello.using(unique_key="a").enqueue_sync(name="held")
    ids = hello.using(on_duplicate="ignore", unique_key="x").enqueue_many_sync([
        Job({"name": "1"}, unique_key="a"),       # held: answered by the holder
        Job({"name": "2"}, unique_key="b"),       # inserted
        Job({"name": "3"}, unique_key="b"),       # an earlier item holds it
        {"name": "4"},                            # the enqueuer's key x: inserted
        Job({"name": "5"}, unique_key="c", on_duplicate="replace"),
        Job({"name": "6"}, unique_key="c", on_duplicate="replace"),  # replaces item 4
        Job({"name": "7"}, unique_key="a", on_duplicate="replace"),  # replaces the holder
    ])
    assert ids[0] == held == ids[6]
    assert ids[1] == ids[2] and ids[4] == ids[5]
    assert len({ids[1], ids[3], ids[4], held}) == 4
    names = dict(conn.execute("SELECT unique_key, args->>'name' FROM akadze.jobs").fetchall())
    assert names == {"a": "7", "b": "2", "x": "4", "c": "6"}
    with pytest.raises(DuplicateJob) as refused:
        hello.using().enqueue_many_sync([Job({"name": "8"}, unique_key="d"),
                                         Job({"name": "9"}, unique_key="b")])
    assert refused.value.job_id == ids[1]
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (4,)


def test_enqueue_many_keep_run_at_within_the_call(conn: Any, hello: Any) -> None:
    later = datetime.now(UTC) + timedelta(hours=2)
    ids = hello.using(unique_key="k", on_duplicate="replace", keep_run_at=True
                      ).enqueue_many_sync([Job({"name": "1"}, run_at=later),
                                           Job({"name": "2"}, delay=1)])
    assert ids[0] == ids[1]
    assert _jobs(conn, "k") == [(ids[0], "queued", "2", later)]


def test_requeue_is_refused_while_another_job_holds_the_key(
        app: Akadze, conn: Any, hello: Any) -> None:
    first = hello.using(unique_key="k").enqueue_sync(name="a")
    _finish(conn, first, "failed")
    second = hello.using(unique_key="k").enqueue_sync(name="b")
    with pytest.raises(DuplicateJob) as refused:
        requeue_sync(app, first)
    assert refused.value.job_id == second
    _finish(conn, second)
    requeue_sync(app, first)
    assert [row[1] for row in _jobs(conn, "k")] == ["queued", "succeeded"]


def _race(database_url: str, hello: Any, key: str, mode: str, threads: int
          ) -> tuple[list[int], list[DuplicateJob]]:
    """``threads`` enqueues of ``key`` at once, each in a transaction that stays open a
    little after its enqueue; the ids answered and the refusals."""
    start = threading.Barrier(threads)
    answers: list[int] = []
    duplicates: list[DuplicateJob] = []
    lock = threading.Lock()

    def enqueue(n: int) -> None:
        with psycopg.connect(database_url) as mine:
            start.wait()
            try:
                job_id = hello.using(session=mine, unique_key=key, on_duplicate=mode,
                                     unique_for=timedelta(hours=1)).enqueue_sync(name=f"t{n}")
                mine.execute("SELECT pg_sleep(0.01)")  # the commit comes later
                mine.commit()
            except DuplicateJob as exc:
                with lock:
                    duplicates.append(exc)
                return
            with lock:
                answers.append(job_id)

    pool = [threading.Thread(target=enqueue, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return answers, duplicates


@pytest.mark.parametrize("mode", ["raise", "ignore", "replace"])
def test_concurrent_enqueues_of_one_key(database_url: str, conn: Any, hello: Any,
                                        mode: str) -> None:
    # A finished job within the period holds the key for half of the rounds. Exactly one
    # job may hold the key afterwards, whatever the mode.
    threads, rounds = 12, 4
    for round_ in range(rounds):
        key = f"k{round_}"
        if round_ % 2:
            done = hello.using(unique_key=key).enqueue_sync(name="done")
            _finish(conn, done)
        answers, duplicates = _race(database_url, hello, key, mode, threads)
        rows = _jobs(conn, key)
        active = [row for row in rows if row[1] == "queued"]
        if round_ % 2:  # the finished job holds the key: nothing is inserted
            assert len(rows) == 1 and not active
            if mode == "raise":
                assert len(duplicates) == threads
            else:
                assert answers == [rows[0][0]] * threads
            continue
        assert len(active) == 1 and len(rows) == 1
        if mode == "raise":
            assert answers == [active[0][0]] and len(duplicates) == threads - 1
        else:
            assert answers == [active[0][0]] * threads and not duplicates
