"""Bad enqueue input raises EnqueueError naming the field, and inserts nothing."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akadze import Akadze, DuplicateJob, EnqueueError, Job, UnknownTask
from akadze.jobspec import META_MAX_BYTES
from akadze.tasks import Task

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def hello(app: Akadze) -> Any:
    @app.task("hello", queue="greetings", priority=7, max_attempts=5)
    def hello(name: str, times: int = 1, extra: Any = None) -> None:
        pass

    return hello


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    assert row is not None
    return int(row[0])


BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"run_at": datetime(2026, 1, 1)}, "run_at"),  # naive
    ({"run_at": "2026-01-01T00:00:00Z"}, "run_at"),
    ({"expires_at": datetime(2026, 1, 1)}, "expires_at"),
    ({"delay": 5, "run_at": NOW}, "delay"),
    ({"delay": -1}, "delay"),
    ({"delay": timedelta(seconds=-1)}, "delay"),
    ({"delay": math.nan}, "delay"),
    ({"delay": math.inf}, "delay"),
    ({"delay": True}, "delay"),
    ({"delay": "5"}, "delay"),
    ({"delay": timedelta(days=999_999_999)}, "delay"),
    ({"priority": 32768}, "priority"),
    ({"priority": -32769}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"priority": True}, "priority"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 2**31}, "max_attempts"),
    ({"max_attempts": "3"}, "max_attempts"),
    ({"meta": ["not", "an", "object"]}, "meta"),
    ({"meta": {1: "int key"}}, "meta"),
    ({"meta": {"nested": {2: "int key"}}}, "meta"),
    ({"meta": {"x": math.nan}}, "meta"),
    ({"meta": {"x": [1.0, -math.inf]}}, "meta"),
    ({"meta": {"x": "a\x00b"}}, "meta"),
    ({"meta": {"a\x00": 1}}, "meta"),
    ({"meta": {"deep": {"deeper": ["\x00"]}}}, "meta"),
    ({"meta": {"x": "y" * META_MAX_BYTES}}, "meta"),
    ({"meta": {"x": (1, 2)}}, "meta"),
    ({"meta": {"x": 1e300}}, "meta"),
    ({"meta": {"x": "\ud800"}}, "meta"),
    ({"meta": {"\ud800": 1}}, "meta"),
    ({"queue": ""}, "queue"),
    ({"queue": 5}, "queue"),
    ({"queue": "a\x00"}, "queue"),
    ({"limit_key": ""}, "limit_key"),
    ({"limit_key": "k\x00"}, "limit_key"),
    ({"limit_key": "k" * 1001}, "limit_key"),
    ({"unique_key": ""}, "unique_key"),
    ({"unique_key": b"bytes"}, "unique_key"),
    ({"unique_key": "u\x00"}, "unique_key"),
]


@pytest.mark.parametrize(("options", "field"), BAD_OPTIONS, ids=lambda v: repr(v)[:40])
def test_bad_options_are_refused(hello: Any, options: dict[str, Any], field: str) -> None:
    with pytest.raises(EnqueueError) as refused:
        hello.using(**options)
    assert refused.value.field == field
    assert field in str(refused.value)


BAD_ARGS: list[tuple[dict[str, Any], str | None]] = [
    ({}, "name"),  # missing
    ({"name": "ada", "age": 3}, "age"),  # unexpected
    ({"name": 5}, "name"),  # wrong type
    ({"name": "ada", "times": "many"}, "times"),
    ({"name": "ada", "times": math.nan}, "times"),
    ({"name": "nul\x00inside"}, "name"),
    ({"name": "ada", "extra": {"k": ["\x00"]}}, "extra"),
    ({"name": "ada", "extra": {"k\x00": 1}}, "extra"),
    ({"name": "ada", "extra": math.inf}, "extra"),
    ({"name": "ada", "extra": [1.0, math.nan]}, "extra"),
    ({"name": "\ud800"}, "name"),
]


@pytest.mark.parametrize(("kwargs", "field"), BAD_ARGS, ids=lambda v: repr(v)[:40])
def test_bad_arguments_insert_nothing(
    database_url: str, conn: Any, hello: Any, kwargs: dict[str, Any], field: str | None
) -> None:
    with psycopg.connect(database_url) as mine:
        with pytest.raises(EnqueueError) as refused:
            hello.using(session=mine).enqueue_sync(**kwargs)
        assert refused.value.field == field
        # The caller's transaction is untouched: nothing was sent.
        assert mine.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with pytest.raises(EnqueueError) as refused_in_bulk:
            hello.using(session=mine).enqueue_many_sync(
                [{"name": "fine"}, {"name": "fine too"}, kwargs]
            )
        assert "item 2" in str(refused_in_bulk.value)
        assert refused_in_bulk.value.field == field
        mine.commit()
    assert count(conn) == 0


def test_json_lookalikes_are_accepted(conn: Any, hello: Any) -> None:
    """Text that only looks like NaN or a NUL escape is stored as it is."""
    tricky = ["NaN", "Infinity", "\\u0000", "\\\\u0000", "tab\there", 'quote"', "é✓"]
    ids = hello.using().enqueue_many_sync([{"name": t, "extra": {"v": t}} for t in tricky])
    single = hello.using(meta={"k": "\\u0000NaN"}).enqueue_sync(name="\\u0000")
    rows = conn.execute(
        "SELECT args->>'name', args->'extra'->>'v' FROM akadze.jobs WHERE id = ANY(%s) "
        "ORDER BY id", (ids,)
    ).fetchall()
    assert rows == [(t, t) for t in tricky]
    assert conn.execute(
        "SELECT args->>'name', meta->>'k' FROM akadze.jobs WHERE id = %s", (single,)
    ).fetchone() == ("\\u0000", "\\u0000NaN")


def test_bad_item_in_bulk_inserts_nothing(database_url: str, conn: Any, hello: Any) -> None:
    good = [{"name": f"n{i}"} for i in range(50)]
    cases: list[Any] = [
        [*good, Job({"name": "x"}, priority=40000)],
        [*good, Job({"name": "x"}, run_at=datetime(2026, 1, 1))],
        [*good, Job({"name": "x"}, meta={"x": math.nan})],
        [*good, Job({"name": "x"}, limit_key="")],
        [*good, Job(["not a mapping"])],  # type: ignore[arg-type]
        [*good, ("name", "x")],
        [*good, None],
    ]
    with psycopg.connect(database_url) as mine:
        for items in cases:
            with pytest.raises(EnqueueError, match="item 50"):
                hello.using(session=mine).enqueue_many_sync(items)
        with pytest.raises(EnqueueError, match="single dict"):
            hello.using(session=mine).enqueue_many_sync({"name": "x"})
        with pytest.raises(DuplicateJob) as refused:  # the second item holds the first's key
            hello.using(session=mine, unique_key="u").enqueue_many_sync(good)
        assert refused.value.field == "unique_key" and refused.value.job_id is None
        mine.commit()
    assert count(conn) == 0


def test_defaults_come_from_the_task(conn: Any, hello: Any) -> None:
    single = hello.using().enqueue_sync(name="one")
    many = hello.using().enqueue_many_sync([{"name": "two"}])
    overridden = hello.using(queue="other", priority=-3, max_attempts=1).enqueue_sync(name="x")
    rows = conn.execute(
        "SELECT id, queue, priority, max_attempts, args FROM akadze.jobs ORDER BY id"
    ).fetchall()
    assert rows == [
        (single, "greetings", 7, 5, {"name": "one"}),
        (many[0], "greetings", 7, 5, {"name": "two"}),
        (overridden, "other", -3, 1, {"name": "x"}),
    ]


def test_unset_arguments_are_not_stored(conn: Any, hello: Any) -> None:
    """Defaults are applied at run time, so a changed default reaches queued jobs."""
    hello.using().enqueue_sync(name="a")
    hello.using().enqueue_many_sync([{"name": "b", "times": 2}])
    args = [row[0] for row in conn.execute("SELECT args FROM akadze.jobs ORDER BY id")]
    assert args == [{"name": "a"}, {"name": "b", "times": 2}]


def test_unknown_task_is_refused(app: Akadze, conn: Any) -> None:
    def orphan(x: int) -> None:
        pass

    task = Task(app, orphan, name="orphan")  # built but never registered
    with pytest.raises(UnknownTask) as refused:
        task.using().enqueue_sync(x=1)
    assert refused.value.field == "task"
    with pytest.raises(UnknownTask):
        app.get_task("nope")
    assert count(conn) == 0


def test_timezone_aware_times_round_trip(conn: Any, hello: Any) -> None:
    berlin = datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=UTC) + timedelta(hours=0)
    expires = berlin + timedelta(days=1)
    job_id = hello.using(run_at=berlin, expires_at=expires).enqueue_sync(name="t")
    assert conn.execute(
        "SELECT run_at, expires_at FROM akadze.jobs WHERE id = %s", (job_id,)
    ).fetchone() == (berlin, expires)


def test_delay_uses_the_database_clock(conn: Any, hello: Any) -> None:
    job_id = hello.using(delay=timedelta(hours=2)).enqueue_sync(name="later")
    many = hello.using(delay=7200).enqueue_many_sync([{"name": "later too"}])
    rows = conn.execute(
        "SELECT run_at - created_at FROM akadze.jobs WHERE id = ANY(%s)", ([job_id, *many],)
    ).fetchall()
    assert rows == [(timedelta(hours=2),), (timedelta(hours=2),)]


# -- property: random options are either stored exactly or refused with nothing stored ----

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_data = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
meta_values = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=8), json_data, max_size=5),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
    st.builds(lambda n: {"big": "x" * n}, st.integers(min_value=8000, max_value=8300)),
)
aware = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
option_sets = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(min_value=-40000, max_value=40000),
        "max_attempts": st.integers(min_value=-2, max_value=2**31 + 2),
        "limit_key": st.one_of(st.text(max_size=10), st.integers()),
        "unique_key": st.text(max_size=10),
        "queue": st.text(max_size=10),
        "meta": meta_values,
        "run_at": st.one_of(aware, st.datetimes(max_value=datetime(2200, 1, 1))),
        "expires_at": aware,
        "delay": st.one_of(st.integers(min_value=-5, max_value=10**6), st.floats()),
    },
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(options=option_sets, name=st.text(max_size=20), bulk=st.booleans())
def test_options_round_trip_or_are_refused(
    database_url: str, hello: Any, options: dict[str, Any], name: str, bulk: bool
) -> None:
    with psycopg.connect(database_url) as mine:
        try:
            if bulk:
                options.pop("unique_key", None)
                [job_id] = hello.using(session=mine, **options).enqueue_many_sync([{"name": name}])
            else:
                job_id = hello.using(session=mine, **options).enqueue_sync(name=name)
        except EnqueueError as refused:
            assert refused.field is not None or "argument" in str(refused)
            status = mine.info.transaction_status
            if bulk:
                # What only serialization finds (a NUL inside an argument) is found
                # while the server reserves the ids: the batch is rolled back to its
                # savepoint, and the caller's transaction stays usable.
                assert status in (psycopg.pq.TransactionStatus.IDLE,
                                  psycopg.pq.TransactionStatus.INTRANS)
                assert mine.execute("SELECT count(*) FROM akadze.jobs").fetchone() == (0,)
            else:
                assert status == psycopg.pq.TransactionStatus.IDLE
            return
        row = mine.execute(
            "SELECT args->>'name', priority, max_attempts, limit_key, unique_key, queue, meta, "
            "run_at, expires_at, run_at - now() FROM akadze.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
        mine.rollback()
    assert row is not None
    stored_name, priority, attempts, limit_key, unique_key, queue, meta, run_at, expires, lag = row
    assert stored_name == name
    assert priority == options.get("priority", 7)
    assert attempts == options.get("max_attempts", 5)
    assert limit_key == options.get("limit_key")
    assert unique_key == options.get("unique_key")
    assert queue == options.get("queue", "greetings")
    assert meta == (options.get("meta") or {})
    if "run_at" in options:
        assert run_at == options["run_at"]
    else:
        delay = options.get("delay") or 0
        expected = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        assert abs(lag - expected) <= timedelta(microseconds=1)
    assert expires == options.get("expires_at")


def test_unknown_option_names_are_a_type_error(hello: Any) -> None:
    # The options are listed once (akadze.jobspec.EnqueueOptions, JobOptions): a name
    # that is not one of them is refused like any unexpected keyword argument.
    with pytest.raises(TypeError, match="unexpected keyword argument 'priorty'"):
        hello.using(priorty=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'unique'"):
        Job({"name": "x"}, unique="u")  # type: ignore[call-arg]
    job = Job(args={"name": "x"}, limit_key="k", priority=2)
    assert job.args == {"name": "x"} and job.options == {"limit_key": "k", "priority": 2}
    assert job == Job({"name": "x"}, priority=2, limit_key="k")
