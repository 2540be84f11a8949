"""enqueue_many (ids and order, per-item options), unique keys, and on_enqueue hooks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from akadze import Akadze, ConfigurationError, DuplicateJob, EnqueuedJob, Job
from akadze.batches import COPY_CHUNK_ROWS


@pytest.fixture
def hello(app: Akadze) -> Any:
    @app.task("hello")
    def hello(name: str, n: int = 0) -> None:
        pass

    return hello


def test_ids_follow_item_order(conn: Any, hello: Any) -> None:
    count = COPY_CHUNK_ROWS * 2 + 7  # more than one COPY chunk
    ids = hello.using().enqueue_many_sync([{"name": f"n{i}", "n": i} for i in range(count)])
    assert len(ids) == count == len(set(ids))
    assert ids == sorted(ids)
    rows = conn.execute("SELECT id, (args->>'n')::int FROM akadze.jobs ORDER BY id").fetchall()
    assert rows == [(job_id, n) for n, job_id in enumerate(ids)]
    assert hello.using().enqueue_many_sync([]) == []


def test_ids_when_the_sequence_is_not_contiguous(conn: Any, hello: Any) -> None:
    # Another session drawing ids in between makes the reserved ids non-contiguous;
    # a sequence stepping by 3 forces that path.
    conn.execute("ALTER TABLE akadze.jobs ALTER COLUMN id SET INCREMENT BY 3")
    ids = hello.using().enqueue_many_sync([{"name": str(i), "n": i} for i in range(10)])
    assert ids[1] - ids[0] == 3
    rows = conn.execute("SELECT id, (args->>'n')::int FROM akadze.jobs ORDER BY id").fetchall()
    assert rows == [(job_id, n) for n, job_id in enumerate(ids)]


def test_per_item_options(conn: Any, hello: Any) -> None:
    at = datetime(2031, 5, 5, 5, 5, 5, tzinfo=UTC)
    ids = hello.using(priority=3, limit_key="shared", meta={"src": "bulk"}).enqueue_many_sync(
        [
            {"name": "plain"},
            Job({"name": "own key"}, limit_key="tenant\t1", priority=9, meta={"t": 1}),
            Job({"name": "at"}, run_at=at, expires_at=at + timedelta(days=1), queue="q2"),
            Job({"name": "tries"}, max_attempts=1, delay=timedelta(minutes=5)),
        ]
    )
    rows = conn.execute(
        "SELECT args->>'name', queue, priority, limit_key, meta, max_attempts, "
        "run_at = %s, expires_at, run_at - now() > interval '4 minutes' "
        "FROM akadze.jobs ORDER BY id", (at,)
    ).fetchall()
    assert [row[0] for row in rows] == ["plain", "own key", "at", "tries"]
    assert rows[0][1:6] == ("default", 3, "shared", {"src": "bulk"}, 3)
    assert rows[1][1:6] == ("default", 9, "tenant\t1", {"t": 1}, 3)
    assert rows[2][1] == "q2" and rows[2][6] is True and rows[2][7] == at + timedelta(days=1)
    assert rows[3][5] == 1 and rows[3][8] is True
    assert len(ids) == 4


def test_duplicate_keeps_the_transaction_usable(database_url: str, conn: Any, hello: Any) -> None:
    with psycopg.connect(database_url) as mine:
        mine.execute("CREATE TABLE orders (id int)")
        first = hello.using(session=mine, unique_key="order-1").enqueue_sync(name="a")
        with pytest.raises(DuplicateJob) as duplicate:
            hello.using(session=mine, unique_key="order-1").enqueue_sync(name="b")
        assert duplicate.value.unique_key == "order-1"
        assert duplicate.value.field == "unique_key"
        mine.execute("INSERT INTO orders VALUES (1)")  # the transaction still works
        mine.commit()
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
    assert conn.execute("SELECT id, args->>'name' FROM akadze.jobs").fetchall() == [(first, "a")]
    # Against a committed job, and on the async path, the same.
    with pytest.raises(DuplicateJob):
        hello.using(unique_key="order-1").enqueue_sync(name="c")
    # A finished job frees its key.
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()")
    again = hello.using(unique_key="order-1").enqueue_sync(name="d")
    assert again > first


async def test_duplicate_async(database_url: str, conn: Any, hello: Any) -> None:
    mine = await psycopg.AsyncConnection.connect(database_url)
    async with mine:
        await hello.using(session=mine, unique_key="k").enqueue(name="a")
        with pytest.raises(DuplicateJob):
            await hello.using(session=mine, unique_key="k").enqueue(name="b")
        await mine.execute("SELECT 1")
        await mine.commit()
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (1,)


async def test_hooks_run_in_the_enqueue_transaction(
    app: Akadze, database_url: str, conn: Any, hello: Any
) -> None:
    seen: list[EnqueuedJob] = []
    conn.execute("CREATE TABLE audit (job_id bigint)")

    @app.on_enqueue
    def record(hook_conn: Any, job: EnqueuedJob) -> None:
        seen.append(job)
        if isinstance(hook_conn, psycopg.Connection):
            hook_conn.execute("INSERT INTO audit VALUES (%s)", (job.id,))

    with psycopg.connect(database_url) as mine:
        one = hello.using(session=mine, meta={"a": 1}, limit_key="k").enqueue_sync(name="x")
        many = hello.using(session=mine).enqueue_many_sync([{"name": "y"}, {"name": "z"}])
        mine.rollback()  # the hook's writes go with the jobs
    assert conn.execute("SELECT count(*) FROM audit").fetchone() == (0,)
    assert [job.id for job in seen] == [one, *many]
    assert seen[0].args == {"name": "x"} and seen[0].meta == {"a": 1}
    assert seen[0].limit_key == "k" and seen[0].queue == "default"
    assert seen[1].run_at == seen[2].run_at

    @app.on_enqueue
    async def also_async(hook_conn: Any, job: EnqueuedJob) -> None:
        await hook_conn.execute("INSERT INTO audit VALUES (%s)", (job.id,))

    await hello.using().enqueue(name="async path")
    assert conn.execute("SELECT count(*) FROM audit").fetchone() == (1,)
    with pytest.raises(ConfigurationError, match="async"):
        hello.using().enqueue_sync(name="sync path refuses async hooks")
    assert conn.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (1,)


def test_failing_hook_removes_the_job(
    app: Akadze, database_url: str, conn: Any, hello: Any
) -> None:
    @app.on_enqueue
    def refuse(hook_conn: Any, job: EnqueuedJob) -> None:
        if job.args["name"] == "bad":
            raise RuntimeError("refused by hook")

    with psycopg.connect(database_url) as mine:
        hello.using(session=mine).enqueue_sync(name="good")
        with pytest.raises(RuntimeError):
            hello.using(session=mine).enqueue_sync(name="bad")
        with pytest.raises(RuntimeError):
            hello.using(session=mine).enqueue_many_sync([{"name": "fine"}, {"name": "bad"}])
        mine.commit()
    assert conn.execute("SELECT args->>'name' FROM akadze.jobs").fetchall() == [("good",)]
