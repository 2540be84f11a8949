"""Bad input at the public entry points: accepted and round-tripped, or refused with an
akadze error and nothing written (property-based, hypothesis)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import psycopg
import pydantic
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from akadze import Akadze, AkadzeError, EnqueueError, LimitError, ScheduleError
from akadze.limits import list_limits_sync, set_limit_sync

FUZZ = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

nasty_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "x" * 300, "é" * 200, "'; DROP TABLE "
                     "akadze.jobs; --", "%(id)s", "{}", "%s"]),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**15, 2**15 - 1, -(2**15) - 1, 2**31, 2**31 - 1, True, False]),
)
junk = st.one_of(st.none(), numbers, nasty_text, st.lists(st.integers(), max_size=2),
                 st.just(timedelta(days=-1)), st.just(object()))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
              st.floats(allow_nan=True), nasty_text),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(nasty_text, inner, max_size=3)),
    max_leaves=8,
)


def _count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM akadze.{table}").fetchone()  # constant name
    assert row is not None
    return int(row[0])


def _fz(a: int, s: str) -> None:
    return None


def _same_json(a: object, b: object) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@given(
    a=st.one_of(st.integers(min_value=-(2**70), max_value=2**70), junk),
    s=nasty_text,
    options=st.fixed_dictionaries({}, optional={
        "priority": st.one_of(st.integers(min_value=-(2**17), max_value=2**17), junk),
        "max_attempts": st.one_of(st.integers(min_value=-5, max_value=2**32), junk),
        "delay": st.one_of(st.floats(allow_nan=True, allow_infinity=True), junk),
        "unique_key": st.one_of(nasty_text, junk),
        "limit_key": st.one_of(nasty_text, junk),
        "queue": st.one_of(nasty_text, junk),
        "meta": st.one_of(st.dictionaries(nasty_text, json_values, max_size=4), json_values),
    }),
)
@example(a="0", s="", options={})  # coerced by the signature: stored as 0
@example(a=True, s="", options={})
@FUZZ
def test_enqueue_accepts_and_round_trips_or_refuses_cleanly(
    app: Akadze, conn: psycopg.Connection[Any], a: Any, s: str, options: dict[str, Any]
) -> None:
    task = app.tasks.get("fz") or app.task("fz", queue="fz")(_fz)
    with conn.transaction(force_rollback=True):
        before = _count(conn, "jobs")
        try:
            with conn.transaction():
                job_id = task.using(session=conn, **options).enqueue_sync(a=a, s=s)
        except AkadzeError as exc:
            assert isinstance(exc, EnqueueError | TypeError) or str(exc)
            assert _count(conn, "jobs") == before, "a refused enqueue wrote a row"
            return
        row = conn.execute(
            "SELECT args, priority, max_attempts, unique_key, limit_key, queue, meta "
            "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
        assert row is not None
        args, priority, max_attempts, unique_key, limit_key, queue, meta = row
        # Accepted arguments are stored as the signature's validation gives them
        # (pydantic's lax mode: "0", 1.0 and True are the int 0, 1 and 1).
        assert args == {"a": pydantic.TypeAdapter(int).validate_python(a), "s": s}
        if options.get("priority") is not None:
            assert priority == options["priority"]
        if options.get("max_attempts") is not None:
            assert max_attempts == options["max_attempts"]
        assert unique_key == options.get("unique_key")
        assert limit_key == options.get("limit_key")
        assert queue == (options.get("queue") or "fz")
        expected_meta = options.get("meta") or {}
        assert _same_json(meta, expected_meta)
        assert _count(conn, "jobs") == before + 1


@given(
    key=nasty_text,
    max_running=st.one_of(st.integers(min_value=-3, max_value=2**33), junk),
    max_starts=st.one_of(st.integers(min_value=-3, max_value=2**33), junk),
    window=st.one_of(st.floats(allow_nan=True, allow_infinity=True), junk,
                     st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=2))),
)
@FUZZ
def test_set_limit_round_trips_or_refuses_cleanly(
    conn: psycopg.Connection[Any], key: Any, max_running: Any, max_starts: Any, window: Any
) -> None:
    with conn.transaction(force_rollback=True):
        before = _count(conn, "limits")
        try:
            with conn.transaction():
                set_limit_sync(conn, key, max_running=max_running, max_starts=max_starts,
                               window=window)
        except LimitError:
            assert _count(conn, "limits") == before, "a refused limit wrote a row"
            return
        (found,) = [summary for summary in list_limits_sync(conn) if summary.key == key]
        assert found.max_running == max_running
        assert found.max_starts == max_starts
        if isinstance(window, timedelta):
            assert found.window == window
        elif window is not None:
            assert found.window is not None
            assert math.isclose(found.window.total_seconds(), float(window), rel_tol=1e-6,
                                abs_tol=1e-6)


@given(
    name=nasty_text,
    cron=st.one_of(st.none(), nasty_text,
                   st.sampled_from(["* * * * *", "0 3 * * *", "61 * * * *", "*/0 * * * *",
                                    "0 0 31 2 *", "@hourly", "0 0 * * 8"])),
    every=st.one_of(st.none(), numbers, nasty_text,
                    st.sampled_from(["15m", "1h", "0s", "-1m", "1d", "1e400s"])),
    timezone=st.one_of(st.none(), nasty_text,
                       st.sampled_from(["Europe/Berlin", "UTC", "Mars/Olympus", "../etc"])),
    args=st.one_of(st.none(), st.dictionaries(nasty_text, json_values, max_size=2)),
)
@settings(max_examples=150, deadline=None)
def test_add_schedule_registers_or_refuses_cleanly(
    name: Any, cron: Any, every: Any, timezone: Any, args: Any
) -> None:
    app = Akadze(database_url="postgresql://u@127.0.0.1:1/none")

    @app.task("tick")
    def tick(n: int = 0) -> None:
        return None

    try:
        schedule = app.add_schedule(name, task="tick", cron=cron, every=every,
                                    timezone=timezone, args=args)
    except ScheduleError as exc:
        assert str(exc)
        assert app.schedules == {}, "a refused schedule was registered"
        return
    assert app.schedules[name] is schedule
    assert (cron is None) != (every is None)
