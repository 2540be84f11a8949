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
