"""app.enqueue_many: a graph of jobs of several tasks in one call (one COPY, one
transaction), its refusals (nothing inserted), and what the jobs are as enqueued."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from worker_support import wait_state

from akadze import Akadze, EnqueueError, Job, UnknownTask, Worker, current, get_job_sync
from akadze.testing import drain


@pytest.fixture
def graph(app: Akadze) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    @app.task("fetch", queue="fetching")
    def fetch(page: int) -> int:
        return page

    @app.task("merge", queue="merging", priority=3)
    def merge(label: str = "") -> int:
        results = current().parent_results()
        seen.setdefault("merges", []).append((label, len(results), sum(results.values())))
        return len(results)

    return {"fetch": fetch, "merge": merge, "seen": seen}


def _rows(conn: Any) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT task, queue, priority, state::text, dependents FROM akadze.jobs "
                        "ORDER BY id").fetchall()


@pytest.mark.timeout(600)
def test_a_fan_out_of_one_task_and_a_fan_in_of_another_in_one_call(
        app: Akadze, conn: Any, graph: dict[str, Any]) -> None:
    # 1 000 fetches and one merge that waits for them all, in one call: the merge
    # runs exactly once, after every fetch has finished, with all their results.
    fetches = [graph["fetch"].job({"page": n}) for n in range(1000)]
    merge = graph["merge"].job({"label": "all"}, after=fetches)
    ids = app.enqueue_many_sync([*fetches, merge])
    assert len(ids) == 1001 and ids == sorted(ids)
    rows = _rows(conn)
    assert rows[0] == ("fetch", "fetching", 0, "queued", True)
    assert rows[-1] == ("merge", "merging", 3, "waiting", False)  # the task's defaults
    assert get_job_sync(app, ids[-1]).waiting_for == 1000

    async def run() -> None:
        async with (Worker(app, queues=["fetching", "merging"], slots=20),
                    Worker(app, queues=["fetching", "merging"], slots=20)):
            await wait_state(conn, ids[-1], "succeeded", within=300)

    asyncio.run(run())
    assert graph["seen"]["merges"] == [("all", 1000, sum(range(1000)))]
    fan_in = conn.execute("SELECT run_count, started_at FROM akadze.jobs WHERE id = %s",
                          (ids[-1],)).fetchone()
    parents = conn.execute("SELECT max(finished_at), count(*) FILTER (WHERE state = "
                           "'succeeded') FROM akadze.jobs WHERE task = 'fetch'").fetchone()
    assert fan_in[0] == 1 and parents[1] == 1000 and fan_in[1] >= parents[0]


def test_a_graph_mixes_tasks_ids_options_and_the_async_api(
        app: Akadze, conn: Any, graph: dict[str, Any]) -> None:
    before = graph["fetch"].using().enqueue_sync(page=100)
    first = graph["fetch"].job({"page": 1}, priority=9)
    named = Job({"page": 2}, task="fetch", after=[before])  # a task by name, and an id
    middle = graph["merge"].job({"label": "middle"}, after=[first, named], queue="other")
    last = Job({"label": "last"}, task=graph["merge"], after=[middle, before])
    ids = asyncio.run(app.enqueue_many([first, named, middle, last]))
    rows = _rows(conn)
    assert rows[1:] == [("fetch", "fetching", 9, "queued", True),
                        ("fetch", "fetching", 0, "waiting", True),
                        ("merge", "other", 3, "waiting", True),
                        ("merge", "merging", 3, "waiting", False)]
    assert get_job_sync(app, ids[3]).parents == (before, ids[2])
    asyncio.run(drain(app, queues=["fetching", "merging", "other"]))
    assert sorted(graph["seen"]["merges"]) == [("last", 2, 2 + 100), ("middle", 2, 1 + 2)]


def test_a_graph_joins_the_callers_transaction_and_its_hooks_see_each_task(
        app: Akadze, graph: dict[str, Any]) -> None:
    seen: list[tuple[str, str]] = []
    app.on_enqueue(lambda conn, job: seen.append((job.task, job.queue)))
    with psycopg.connect(app.database_url) as mine:
        fetch = graph["fetch"].job({"page": 1})
        ids = app.enqueue_many_sync([fetch, graph["merge"].job(after=[fetch])], session=mine)
        mine.rollback()
    assert seen == [("fetch", "fetching"), ("merge", "merging")]
    with psycopg.connect(app.database_url) as check:
        assert check.execute("SELECT count(*) FROM akadze.jobs WHERE id = ANY(%s)",
                             (ids,)).fetchone() == (0,)
    assert app.enqueue_many_sync([]) == []


def test_bad_graphs_of_several_tasks_are_refused_with_nothing_inserted(
        app: Akadze, conn: Any, graph: dict[str, Any]) -> None:
    fetch, merge = graph["fetch"], graph["merge"]
    a, b = fetch.job({"page": 1}), merge.job()
    a.options["after"] = (b,)  # a cycle across the two tasks, made by hand
    b.options["after"] = (a,)
    with pytest.raises(EnqueueError, match="cycle"):
        app.enqueue_many_sync([a, b])
    with pytest.raises(EnqueueError, match="do not exist: 999999") as refused:
        app.enqueue_many_sync([fetch.job({"page": 1}), merge.job(after=[999999])])
    assert refused.value.field == "after"
    with pytest.raises(EnqueueError, match="not an item of this call"):
        app.enqueue_many_sync([merge.job(after=[fetch.job({"page": 3})])])
    with pytest.raises(EnqueueError, match=r"item 1: .*page") as refused:  # args, per task
        app.enqueue_many_sync([merge.job(), fetch.job({"page": "x"})])
    with pytest.raises(EnqueueError, match="names no task") as refused:
        app.enqueue_many_sync([fetch.job({"page": 1}), Job({"page": 2})])
    assert refused.value.field == "task"
    with pytest.raises(EnqueueError, match=r"takes akadze\.Job"):
        app.enqueue_many_sync([{"page": 1}])  # type: ignore[list-item]
    with pytest.raises(UnknownTask, match="'nope'"):
        app.enqueue_many_sync([Job(task="nope")])
    other = Akadze(app.database_url)

    @other.task("fetch")
    def elsewhere(page: int) -> None: ...

    with pytest.raises(UnknownTask, match="not registered on this app"):
        app.enqueue_many_sync([elsewhere.job({"page": 1})])
    with pytest.raises(EnqueueError, match=r"app\.enqueue_many") as refused:  # one task call
        fetch.using().enqueue_many_sync([fetch.job({"page": 1}), merge.job()])
    assert refused.value.field == "task"
    with pytest.raises(EnqueueError, match="registered task or its name"):
        Job(task=42)  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM akadze.job_dependencies").fetchone() == (0,)
    # a Job of this very task is still an item of the task's own enqueue_many
    assert len(fetch.using().enqueue_many_sync([fetch.job({"page": 1}), {"page": 2}])) == 2


def _parents(conn: Any, job_id: int) -> list[int]:
    return [int(r[0]) for r in conn.execute(
        "SELECT parent_id FROM akadze.job_dependencies WHERE child_id = %s ORDER BY 1",
        (job_id,))]


def test_on_duplicate_with_after_keeps_the_holders_parents(
        app: Akadze, conn: Any, graph: dict[str, Any]) -> None:
    # "ignore": the holder answers as it is (its parents, not the new after's).
    # "replace": the holder takes the new arguments and keeps its parents; an after
    # naming the same parents is fine, one naming others is refused (EnqueueError,
    # field "after", nothing written), in a single enqueue as in a bulk one.
    fetch, merge = graph["fetch"], graph["merge"]
    p1, p2, p3 = fetch.using(delay=3600).enqueue_many_sync([{"page": n} for n in (1, 2, 3)])
    keyed = {"unique_key": "merge:7"}
    holder = merge.using(after=[p1, p2], **keyed).enqueue_sync(label="first")
    assert merge.using(after=[p3], on_duplicate="ignore", **keyed).enqueue_sync() == holder
    assert _parents(conn, holder) == [p1, p2]
    replace = merge.using(on_duplicate="replace", **keyed)
    assert replace.enqueue_sync(label="no after") == holder
    assert merge.using(after=[p2, p1], on_duplicate="replace", **keyed).enqueue_sync(
        label="same after") == holder
    assert conn.execute("SELECT args->>'label', state::text FROM akadze.jobs WHERE id = %s",
                        (holder,)).fetchone() == ("same after", "waiting")
    with pytest.raises(EnqueueError, match=rf"job {holder} holds the unique_key and waits "
                       rf"for \[{p1}, {p2}\].*after names \[{p3}\]") as refused:
        merge.using(after=[p3], on_duplicate="replace", **keyed).enqueue_sync(label="other")
    assert refused.value.field == "after"
    with pytest.raises(EnqueueError, match="keeps the parents"):  # in enqueue_many too
        merge.using(on_duplicate="replace", **keyed).enqueue_many_sync(
            [Job({"label": "bulk"}, after=[p1])])
    fresh = fetch.job({"page": 4})
    with pytest.raises(EnqueueError, match="new jobs of this call"):  # a graph's new rows
        app.enqueue_many_sync([fresh, merge.job({"label": "graph"}, after=[fresh],
                                                on_duplicate="replace", **keyed)])
    lonely = merge.using(unique_key="merge:8").enqueue_sync(label="lonely")
    with pytest.raises(EnqueueError, match="waits for no job"):
        merge.using(after=[p1], unique_key="merge:8", on_duplicate="replace").enqueue_sync()
    assert conn.execute("SELECT args->>'label' FROM akadze.jobs WHERE id = ANY(%s) ORDER BY id",
                        ([holder, lonely],)).fetchall() == [("same after",), ("lonely",)]
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (5,)
    # a bulk replace naming the holder's parents, by id and as an item answered by a
    # holder of its own key ("ignore"), goes through
    again = fetch.job({"page": 1}, unique_key="page:1", on_duplicate="ignore")
    first_page = fetch.using(unique_key="page:1").enqueue_sync(page=1)
    base = merge.using(after=[first_page, p2], unique_key="merge:9").enqueue_sync(label="a")
    ids = app.enqueue_many_sync([again, merge.job({"label": "b"}, after=[again, p2],
                                                  unique_key="merge:9",
                                                  on_duplicate="replace")])
    assert ids == [first_page, base] and _parents(conn, base) == sorted([first_page, p2])


def test_a_replace_within_one_call_keeps_the_replaced_items_parents(
        app: Akadze, conn: Any, graph: dict[str, Any]) -> None:
    fetch, merge = graph["fetch"], graph["merge"]
    page = fetch.job({"page": 1})
    keyed = {"unique_key": "merge:1", "on_duplicate": "replace"}
    ids = app.enqueue_many_sync([page, merge.job({"label": "one"}, after=[page], **keyed),
                                 merge.job({"label": "two"}, **keyed)])
    assert ids[1] == ids[2] and _parents(conn, ids[2]) == [ids[0]]
    assert conn.execute("SELECT args->>'label', state::text FROM akadze.jobs WHERE id = %s",
                        (ids[2],)).fetchone() == ("two", "waiting")
    other = fetch.job({"page": 2})
    with pytest.raises(EnqueueError, match="replaces item 1 of this call"):
        app.enqueue_many_sync([page, merge.job(after=[page], unique_key="merge:2",
                                               on_duplicate="replace"),
                               other, merge.job(after=[other], unique_key="merge:2",
                                                on_duplicate="replace")])
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (2,)
