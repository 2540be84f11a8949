"""Workflows: jobs that wait for other jobs (after=, after_policy), released or cancelled
in the transaction of their parent's terminal write, refused graphs, retention, reads."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from worker_support import wait_state

from akadze import (
    Akadze,
    EnqueueError,
    Fail,
    Job,
    JobState,
    Worker,
    current,
    get_job_sync,
    list_jobs_sync,
    request_cancel_sync,
)
from akadze.retention import prune_sync
from akadze.testing import drain


@pytest.fixture
def flow(app: Akadze) -> dict[str, Any]:
    seen: dict[str, Any] = {"results": {}}

    @app.task("step")
    def step(n: int = 0) -> int:
        return n * 10

    @app.task("boom", max_attempts=1)
    def boom() -> None:
        raise Fail("no")

    @app.task("join")
    def join(n: int = 0) -> int:
        results = current().parent_results()
        seen["results"][n] = results
        return len(results)

    @app.task("ajoin")
    async def ajoin() -> None:
        seen["async"] = await current().parent_results_async()

    return {"step": step, "boom": boom, "join": join, "ajoin": ajoin, "seen": seen}


def _state(conn: Any, job_id: int) -> str:
    row = conn.execute("SELECT state::text FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
    return str(row[0])


def test_a_child_waits_for_its_parents_and_reads_their_results(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    a = flow["step"].using().enqueue_sync(n=1)
    b = flow["step"].using().enqueue_sync(n=2)
    child = flow["join"].using(after=[a, b]).enqueue_sync(n=7)
    achild = flow["ajoin"].using(after=[a]).enqueue_sync()
    assert _state(conn, child) == "waiting"
    summary = get_job_sync(app, child)
    assert summary.state is JobState.WAITING and summary.parents == (a, b)
    assert summary.parent_count == 2 and summary.waiting_for == 2
    assert get_job_sync(app, a).children == (child, achild)
    counts = asyncio.run(drain(app))
    assert counts["succeeded"] == 4
    assert flow["seen"]["results"][7] == {a: 10, b: 20}
    assert flow["seen"]["async"] == {a: 10}
    listed = {job.id: job for job in list_jobs_sync(app)}
    assert listed[child].parents == (a, b) and listed[a].child_count == 2


def test_a_child_of_finished_parents_is_queued_at_once(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    a = flow["step"].using().enqueue_sync(n=1)
    asyncio.run(drain(app))
    child = flow["join"].using(after=[a]).enqueue_sync(n=1)
    assert _state(conn, child) == "queued"
    asyncio.run(drain(app))
    assert flow["seen"]["results"][1] == {a: 10}


@pytest.mark.timeout(600)
def test_fan_out_fan_in_in_one_call_runs_the_fan_in_once_after_all(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    parents = [Job({"n": i}) for i in range(1000)]
    fan_in = Job({"n": -1}, after=parents)
    ids = flow["step"].using().enqueue_many_sync([*parents, fan_in])
    assert _state(conn, ids[-1]) == "waiting"
    # the fan-in is a "step" too; run with two concurrent workers
    async def run() -> None:
        async with Worker(app, slots=20, listen=True), Worker(app, slots=20, listen=True):
            await wait_state(conn, ids[-1], "succeeded", within=300)  # a loaded machine

    asyncio.run(run())
    row = conn.execute(
        "SELECT run_count, started_at FROM akadze.jobs WHERE id = %s", (ids[-1],)).fetchone()
    last = conn.execute("SELECT max(finished_at), count(*) FILTER (WHERE state = 'succeeded') "
                        "FROM akadze.jobs WHERE id <> %s", (ids[-1],)).fetchone()
    assert row[0] == 1 and last[1] == 1000 and row[1] >= last[0]


def test_a_failed_parent_cancels_its_subtree_naming_it(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    child = Job({"n": 1})  # waits for the enqueuer's after
    grandchild = Job({"n": 2}, after=[child])
    ids = flow["boom"].using().enqueue_many_sync([{}])
    ids = [ids[0], *flow["step"].using(after=[ids[0]]).enqueue_many_sync([child, grandchild])]
    anyway = flow["step"].using(after=[ids[0]], after_policy="run").enqueue_sync(n=3)
    asyncio.run(drain(app))
    assert [_state(conn, i) for i in ids] == ["failed", "cancelled", "cancelled"]
    assert _state(conn, anyway) == "succeeded"
    child_errors = get_job_sync(app, ids[1]).errors
    assert child_errors[-1]["error"] == "ParentFailed"
    assert child_errors[-1]["parent"] == ids[0] and str(ids[0]) in child_errors[-1]["message"]
    assert get_job_sync(app, ids[2]).errors[-1]["parent"] == ids[1]


def test_a_parent_that_had_failed_cancels_a_new_child_and_its_items(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    failed = flow["boom"].using().enqueue_sync()
    asyncio.run(drain(app))
    child = Job({"n": 1}, after=[failed])
    ids = flow["step"].using().enqueue_many_sync([child, Job({"n": 2}, after=[child])])
    assert [_state(conn, i) for i in ids] == ["cancelled", "cancelled"]
    single = flow["step"].using(after=[failed]).enqueue_sync(n=3)
    assert _state(conn, single) == "cancelled"
    assert flow["step"].using(after=[failed], after_policy="run").enqueue_sync(n=4) and (
        conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = 'queued'").fetchone()
        == (1,))


def test_cancelling_a_waiting_job_cancels_its_children(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    root = flow["step"].using(delay=3600).enqueue_sync(n=1)
    middle = flow["step"].using(after=[root]).enqueue_sync(n=2)
    leaf = flow["step"].using(after=[middle]).enqueue_sync(n=3)
    assert request_cancel_sync(app, middle) is True
    assert [_state(conn, i) for i in (root, middle, leaf)] == ["queued", "cancelled", "cancelled"]


def test_unknown_ids_and_bad_graphs_are_refused_with_nothing_inserted(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    known = flow["step"].using().enqueue_sync(n=1)
    step = flow["step"]
    with pytest.raises(EnqueueError, match="do not exist: 999999") as refused:
        step.using(after=[known, 999999]).enqueue_sync(n=2)
    assert refused.value.field == "after"
    with pytest.raises(EnqueueError, match="do not exist"):
        step.using().enqueue_many_sync([Job({"n": 3}, after=[999998]), {"n": 4}])
    a, b = Job({"n": 5}), Job({"n": 6})
    a.options["after"] = (b,)  # a graph made by hand: a <- b <- a
    b.options["after"] = (a,)
    with pytest.raises(EnqueueError, match="cycle"):
        step.using().enqueue_many_sync([a, b])
    outsider = Job({"n": 7})
    with pytest.raises(EnqueueError, match="not an item of this call"):
        step.using().enqueue_many_sync([Job({"n": 8}, after=[outsider])])
    twice = Job({"n": 9})
    with pytest.raises(EnqueueError, match="more than once"):
        step.using().enqueue_many_sync([twice, twice, Job({"n": 10}, after=[twice])])
    with pytest.raises(EnqueueError, match="job id"):
        step.using(after=[Job({"n": 11})]).enqueue_sync(n=11)
    for bad in (["1"], "12", [0], [True], 5):
        with pytest.raises(EnqueueError) as refused:
            step.using(after=bad)
        assert refused.value.field == "after"
    with pytest.raises(EnqueueError) as refused:
        step.using(after=[known], after_policy="skip")
    assert refused.value.field == "after_policy"
    with psycopg.connect(app.database_url) as mine:  # joined: the transaction survives
        with pytest.raises(EnqueueError):
            step.using(session=mine, after=[999997]).enqueue_sync(n=12)
        step.using(session=mine).enqueue_sync(n=13)
        mine.commit()
    rows = conn.execute("SELECT (args->>'n')::int, dependents FROM akadze.jobs ORDER BY id")
    assert rows.fetchall() == [(1, False), (13, False)]
    assert conn.execute("SELECT count(*) FROM akadze.job_dependencies").fetchone() == (0,)


def test_retention_keeps_a_parent_that_a_child_still_needs(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    a = flow["step"].using().enqueue_sync(n=1)
    b = flow["step"].using(delay=3600).enqueue_sync(n=2)
    child = flow["join"].using(after=[a, b]).enqueue_sync(n=3)
    flow["step"].using().enqueue_sync(n=4)  # no children: pruned
    asyncio.run(drain(app))  # a and lonely succeed; b is not due, the child waits
    later = datetime.now(UTC) + app.retention + timedelta(days=1)
    with psycopg.connect(app.database_url, autocommit=True) as mine:
        prune_sync(mine, app, later)
    left = {int(r[0]) for r in conn.execute("SELECT id FROM akadze.jobs")}
    assert left == {a, b, child}
    conn.execute("UPDATE akadze.jobs SET run_at = now() WHERE id = %s", (b,))
    asyncio.run(drain(app))
    assert flow["seen"]["results"][3] == {a: 10, b: 20}
    with psycopg.connect(app.database_url, autocommit=True) as mine:
        prune_sync(mine, app, later + timedelta(days=30))
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM akadze.job_dependencies").fetchone() == (0,)


AUDIT = """
CREATE TABLE akadze_test_releases (child bigint, unfinished int, tx xid8);
CREATE FUNCTION akadze_test_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- runs at the commit of the releasing transaction: what its parents are then
    INSERT INTO akadze_test_releases
    SELECT NEW.id, count(*) FILTER (WHERE p.state <> 'succeeded'), pg_current_xact_id()
    FROM akadze.job_dependencies d JOIN akadze.jobs p ON p.id = d.parent_id
    WHERE d.child_id = NEW.id;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER akadze_test_release AFTER UPDATE ON akadze.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state = 'waiting' AND NEW.state = 'queued')
    EXECUTE FUNCTION akadze_test_audit();
"""


@pytest.mark.timeout(600)
def test_children_are_released_once_under_concurrent_workers(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    # 40 fan-ins over overlapping sets of 300 parents, run by three workers at once.
    # A commit-time trigger records each release: exactly one per child, in a
    # transaction where every parent of the child has succeeded.
    conn.execute(AUDIT)
    parents = flow["step"].using().enqueue_many_sync([{"n": i} for i in range(300)])
    children = [
        flow["step"].using(after=[parents[(c * 7 + k * 13) % 300] for k in range(25)]
                           ).enqueue_sync(n=1000 + c)
        for c in range(40)
    ]

    async def run() -> None:
        async with (Worker(app, slots=8), Worker(app, slots=8), Worker(app, slots=8)):
            for child in children:
                await wait_state(conn, child, "succeeded", within=300)

    asyncio.run(run())
    releases = conn.execute(
        "SELECT child, unfinished FROM akadze_test_releases ORDER BY child").fetchall()
    assert releases == [(child, 0) for child in children]
    runs = conn.execute("SELECT count(*) FROM akadze.jobs WHERE id = ANY(%s) AND run_count = 1",
                        (children,)).fetchone()
    assert runs == (40,)


def test_children_enqueued_while_their_parents_finish_are_never_stuck(
        app: Akadze, database_url: str, conn: Any, flow: dict[str, Any]) -> None:
    # Parents are finished (as a worker's outcome write would) in one thread while
    # children naming them are enqueued in others: a child sees each parent either
    # finished before its enqueue or counts it at the parent's commit; none is left
    # waiting once every parent has succeeded, and none is released early.
    parents = flow["step"].using().enqueue_many_sync([{"n": i} for i in range(60)])
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = ANY(%s)", (parents,))
    go = threading.Barrier(4)
    children: list[int] = []
    lock = threading.Lock()

    def finish() -> None:
        with psycopg.connect(database_url, autocommit=True) as mine:
            go.wait()
            for parent in parents:
                mine.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                             "WHERE id = %s", (parent,))

    def enqueue(offset: int) -> None:
        go.wait()
        for c in range(20):
            picked = [parents[(offset * 7 + c * 3 + k) % 60] for k in range(5)]
            child = flow["step"].using(after=picked).enqueue_sync(n=1000 + c)
            with lock:
                children.append(child)

    threads = [threading.Thread(target=finish)] + [
        threading.Thread(target=enqueue, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = conn.execute(
        "SELECT state::text, (SELECT count(*) FROM akadze.job_dependencies d "
        "WHERE d.child_id = j.id AND NOT d.done) FROM akadze.jobs j WHERE id = ANY(%s)",
        (children,)).fetchall()
    assert len(rows) == 60 and set(rows) == {("queued", 0)}


def test_a_fan_in_row_is_written_once_its_parents_count_on_their_edges(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    # Each parent's end marks its own edge done and takes the child's row lock without
    # writing the row: the fan-in's row keeps the version the enqueue wrote until its
    # release (before migration 0013, each parent rewrote it to decrement a counter).
    parents = [Job({"n": i}) for i in range(200)]
    ids = flow["step"].using().enqueue_many_sync([*parents, Job({"n": -1}, after=parents)])
    child = ids[-1]
    conn.execute("UPDATE akadze.jobs SET state = 'running' WHERE id = ANY(%s)", (ids[:-1],))
    written = conn.execute("SELECT xmin::text FROM akadze.jobs WHERE id = %s",
                           (child,)).fetchone()
    for parent in ids[:-2]:
        conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                     "WHERE id = %s", (parent,))
    assert conn.execute("SELECT xmin::text, state::text FROM akadze.jobs WHERE id = %s",
                        (child,)).fetchone() == (written[0], "waiting")
    assert get_job_sync(app, child).waiting_for == 1
    pending = conn.execute("SELECT count(*) FROM akadze.job_dependencies "
                           "WHERE child_id = %s AND NOT done", (child,)).fetchone()
    assert pending == (1,)
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() "
                 "WHERE id = %s", (ids[-2],))
    assert _state(conn, child) == "queued"
    assert get_job_sync(app, child).waiting_for == 0


def test_a_parent_ending_in_a_repeatable_read_transaction_is_refused(
        app: Akadze, database_url: str, conn: Any, flow: dict[str, Any]) -> None:
    # REPEATABLE READ keeps its first snapshot: two parents ending at once could each
    # miss the other's edge and leave the child waiting. The end is refused, clearly;
    # READ COMMITTED and SERIALIZABLE release the child.
    parent = flow["step"].using().enqueue_sync(n=1)
    lonely = flow["step"].using().enqueue_sync(n=2)
    child = flow["step"].using(after=[parent]).enqueue_sync(n=3)
    finish = "UPDATE akadze.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s"
    with psycopg.connect(database_url) as mine:
        mine.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        mine.execute(finish, (lonely,))  # no children: nothing to count
        mine.commit()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match="READ COMMITTED"):
            mine.execute(finish, (parent,))
        mine.rollback()
        mine.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        mine.execute(finish, (parent,))
        mine.commit()
    assert _state(conn, child) == "queued"


def test_a_parent_deleted_before_it_finished_counts_as_cancelled(
        app: Akadze, conn: Any, flow: dict[str, Any]) -> None:
    # DELETE FROM akadze.jobs by hand (or any tool): a "cancel" child is cancelled
    # naming the deleted parent, and its subtree with it; a "run" child counts the
    # parent as done; a child deleted with its parent is simply gone; no edge is left
    # to a job that does not exist.
    gone = flow["step"].using(delay=3600).enqueue_sync(n=1)
    kept = flow["step"].using(delay=3600).enqueue_sync(n=2)
    child = flow["step"].using(after=[gone, kept]).enqueue_sync(n=3)
    grandchild = flow["step"].using(after=[child]).enqueue_sync(n=4)
    anyway = flow["step"].using(after=[gone], after_policy="run").enqueue_sync(n=5)
    anyway_two = flow["step"].using(after=[gone, kept], after_policy="run").enqueue_sync(n=6)
    conn.execute("DELETE FROM akadze.jobs WHERE id = %s", (gone,))
    assert [_state(conn, i) for i in (child, grandchild, anyway, anyway_two)] == [
        "cancelled", "cancelled", "queued", "waiting"]
    entry = get_job_sync(app, child).errors[-1]
    assert entry["error"] == "ParentDeleted" and entry["parent"] == gone
    assert str(gone) in entry["message"]
    assert get_job_sync(app, grandchild).errors[-1]["error"] == "ParentFailed"
    assert get_job_sync(app, anyway_two).waiting_for == 1
    orphans = conn.execute(
        "SELECT count(*) FROM akadze.job_dependencies d "
        "WHERE NOT EXISTS (SELECT 1 FROM akadze.jobs p WHERE p.id = d.parent_id)")
    assert orphans.fetchone() == (0,)
    # a parent and its children deleted in one statement; a finished parent deleted
    root = flow["step"].using(delay=3600).enqueue_sync(n=7)
    leaves = [flow["step"].using(after=[root]).enqueue_sync(n=8 + k) for k in range(3)]
    deleted = conn.execute("DELETE FROM akadze.jobs WHERE id = ANY(%s)", ([root, *leaves],))
    assert deleted.rowcount == 4
    conn.execute("UPDATE akadze.jobs SET run_at = now() WHERE id = %s", (kept,))
    asyncio.run(drain(app))
    assert _state(conn, anyway_two) == "succeeded"
    conn.execute("DELETE FROM akadze.jobs WHERE id = %s", (kept,))
    assert _state(conn, anyway_two) == "succeeded"
    assert conn.execute("SELECT count(*) FROM akadze.job_dependencies d WHERE NOT EXISTS "
                        "(SELECT 1 FROM akadze.jobs p WHERE p.id = d.parent_id)"
                        ).fetchone() == (0,)
