"""The size limits of a job's arguments and result (issue 21, finding 6): refused at
enqueue on every path with an EnqueueError naming the field and the limit, and by the
schema's CHECK (migration 0008) for every other writer."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from akadze import Akadze, Job
from akadze.arguments import (
    DEFAULT_PAYLOAD_BYTES,
    MAX_PAYLOAD_BYTES,
    STORED_CEILING_BYTES,
    oversize,
)
from akadze.errors import ConfigurationError, EnqueueError, MigrationError, ScheduleError
from akadze.migrate import migrate_sync

LIMIT = 1000
# {"blob":"..."}: the compact JSON of the arguments around the string
OVERHEAD = len('{"blob":""}')


@pytest.fixture
def small(database_url: str) -> Akadze:
    app = Akadze(database_url, max_args_bytes=LIMIT)

    @app.task("store", queue="sizes")
    def store(blob: str) -> None:
        return None

    return app


def _jobs(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM akadze.jobs").fetchone()
    assert row is not None
    return int(row[0])


def _refused(info: pytest.ExceptionInfo[EnqueueError], size: int, where: str = "") -> None:
    assert info.value.field == "args"
    assert str(info.value) == (
        f"{where}task 'store': arguments are {size} bytes as JSON; "
        f"at most {LIMIT} (max_args_bytes)"
    )


def test_the_limit_itself_is_accepted_one_byte_more_is_not(
        small: Akadze, conn: psycopg.Connection[Any]) -> None:
    task = small.tasks["store"]
    task.using().enqueue_sync(blob="x" * (LIMIT - OVERHEAD))
    with pytest.raises(EnqueueError) as info:
        task.using().enqueue_sync(blob="x" * (LIMIT - OVERHEAD + 1))
    _refused(info, LIMIT + 1)
    # the size is of the UTF-8 text: one "é" is two bytes
    with pytest.raises(EnqueueError) as info:
        task.using().enqueue_sync(blob="é" * ((LIMIT - OVERHEAD) // 2 + 1))
    assert _jobs(conn) == 1


async def test_every_enqueue_path_refuses_and_inserts_nothing(
        small: Akadze, conn: psycopg.Connection[Any]) -> None:
    task = small.tasks["store"]
    big = "x" * LIMIT
    with pytest.raises(EnqueueError) as info:
        await task.using().enqueue(blob=big)
    _refused(info, LIMIT + OVERHEAD)
    with pytest.raises(EnqueueError) as info:
        task.using().enqueue_many_sync([{"blob": "a"}, {"blob": "b"}, {"blob": big}])
    _refused(info, LIMIT + OVERHEAD, "item 2: ")
    with pytest.raises(EnqueueError) as info:
        await task.using().enqueue_many([Job({"blob": "a"}, priority=1), Job({"blob": big})])
    _refused(info, LIMIT + OVERHEAD, "item 1: ")
    with pytest.raises(EnqueueError) as info:
        task.validate_args({"blob": big})
    _refused(info, LIMIT + OVERHEAD)
    with psycopg.connect(conn.info.dsn) as session:  # joined to the caller's transaction
        with pytest.raises(EnqueueError):
            task.using(session=session).enqueue_sync(blob=big)
        assert task.using(session=session).enqueue_sync(blob="fits") > 0
    assert _jobs(conn) == 1


def test_a_schedule_is_refused_at_registration(small: Akadze) -> None:
    with pytest.raises(ScheduleError, match=r"arguments are 1011 bytes as JSON; at most 1000"):
        small.add_schedule("big", task="store", every=60, args={"blob": "x" * LIMIT})
    assert "big" not in small.schedules
    small.add_schedule("fits", task="store", every=60, args={"blob": "x"})


def test_the_default_is_one_mib(app: Akadze) -> None:
    @app.task("store")
    def store(blob: str) -> None:
        return None

    assert app.max_args_bytes == app.max_result_bytes == DEFAULT_PAYLOAD_BYTES == 2**20
    with pytest.raises(EnqueueError, match="at most 1048576 \\(max_args_bytes\\)"):
        app.tasks["store"].using().enqueue_many_sync([{"blob": "x" * DEFAULT_PAYLOAD_BYTES}])


@pytest.mark.parametrize("value", [0, -1, MAX_PAYLOAD_BYTES + 1, True, 1.5, "1"])
def test_the_settings_are_checked(value: Any) -> None:
    for name in ("max_args_bytes", "max_result_bytes"):
        with pytest.raises(ConfigurationError, match=f"^{name} must be a whole number"):
            Akadze("postgresql://u@h/db", **{name: value})
    assert Akadze("postgresql://u@h/db", max_result_bytes=MAX_PAYLOAD_BYTES).max_result_bytes


def test_oversize_is_the_message_the_worker_can_use_for_results() -> None:
    assert oversize("the result is", 10, 10, "max_result_bytes") is None
    assert oversize("the result is", 11, 10, "max_result_bytes") == (
        "the result is 11 bytes as JSON; at most 10 (max_result_bytes)")


# -- the schema's CHECK (migration 0008) ------------------------------------------------


def test_the_schema_refuses_arguments_and_results_over_the_ceiling(
        conn: psycopg.Connection[Any]) -> None:
    over = STORED_CEILING_BYTES  # the string plus its jsonb header is over the ceiling
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        conn.execute("INSERT INTO akadze.jobs (queue, task, args) "
                     "VALUES ('q', 't', jsonb_build_object('a', repeat('x', %s)))", (over,))
    assert info.value.diag.constraint_name == "jobs_args_size"
    row = conn.execute("INSERT INTO akadze.jobs (queue, task, args) "
                       "VALUES ('q', 't', '{}') RETURNING id").fetchone()
    assert row is not None
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        conn.execute("UPDATE akadze.jobs SET result = to_jsonb(repeat('x', %s)) WHERE id = %s",
                     (over, row[0]))
    assert info.value.diag.constraint_name == "jobs_result_size"
    conn.execute("UPDATE akadze.jobs SET result = to_jsonb(repeat('x', 1000)) WHERE id = %s",
                 (row[0],))


def _validated(conn: psycopg.Connection[Any]) -> dict[str, bool]:
    return {name: valid for name, valid in conn.execute(
        "SELECT conname, convalidated FROM pg_constraint "
        "WHERE conrelid = 'akadze.jobs'::regclass AND conname LIKE 'jobs_%%_size'")}


def test_an_old_row_over_the_ceiling_fails_the_validation_until_it_is_gone(
        database_url: str, conn: psycopg.Connection[Any]) -> None:
    # The state right after 0008's transaction on a database that holds an old row
    # over the ceiling (stored uncompressed, as an incompressible value would be).
    conn.execute("ALTER TABLE akadze.jobs DROP CONSTRAINT jobs_args_size")
    conn.execute("ALTER TABLE akadze.jobs ALTER COLUMN args SET STORAGE EXTERNAL")
    conn.execute("INSERT INTO akadze.jobs (queue, task, args) "
                 "VALUES ('q', 't', jsonb_build_object('a', repeat('x', %s)))",
                 (STORED_CEILING_BYTES,))
    conn.execute("ALTER TABLE akadze.jobs ADD CONSTRAINT jobs_args_size "
                 "CHECK (pg_column_size(args) <= 67108864) NOT VALID")
    with pytest.raises(MigrationError) as info:
        migrate_sync(database_url)
    assert str(info.value).startswith(
        "migration 0008_payload_sizes is applied, but its after-commit step failed: "
        'check constraint "jobs_args_size" of relation "jobs" is violated by some row')
    assert _validated(conn) == {"jobs_args_size": False, "jobs_result_size": True}
    # not valid yet, but new rows are checked all the same
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE akadze.jobs SET args = jsonb_build_object('b', repeat('y', %s))",
                     (STORED_CEILING_BYTES,))
    conn.execute("DELETE FROM akadze.jobs")
    assert migrate_sync(database_url) == []  # nothing to apply; the validation is done
    assert _validated(conn) == {"jobs_args_size": True, "jobs_result_size": True}
