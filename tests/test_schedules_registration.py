"""Registering periodic schedules: what is accepted, what is refused (and then nothing
is registered)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from akadze import Akadze, EnqueueError, ScheduleError
from akadze.schedules import Schedule


@pytest.fixture
def bare() -> Akadze:
    app = Akadze(database_url="postgresql://nobody@127.0.0.1:1/none")

    @app.task("report", queue="reports")
    def report(day: str = "today", copies: int = 1) -> None:
        return None

    return app


def test_periodic_registers_task_and_schedule(bare: Akadze) -> None:
    @bare.periodic("nightly", cron="0 3 * * *", timezone="Europe/Berlin", overlap=False,
                   queue="maintenance", args={"full": True})
    def nightly(full: bool = False) -> str:
        return "done" if full else "partial"

    assert "nightly" in bare.tasks and bare.tasks["nightly"].queue == "maintenance"
    schedule = bare.schedules["nightly"]
    assert isinstance(schedule, Schedule)
    assert schedule.task == "nightly" and schedule.overlap is False
    assert schedule.args == {"full": True}
    assert schedule.when == "cron 0 3 * * * (Europe/Berlin)"
    # The decorated function is still callable.
    assert nightly(full=True) == "done"
    after = datetime(2024, 6, 1, 12, tzinfo=UTC)
    assert schedule.next_fire(after) == datetime(2024, 6, 2, 1, tzinfo=UTC)  # 03:00 CEST


def test_every_counts_from_the_epoch(bare: Akadze) -> None:
    schedule = bare.add_schedule("quarter", task="report", every=timedelta(minutes=15))
    at = datetime(2024, 6, 1, 12, 7, 30, tzinfo=UTC)
    assert schedule.next_fire(at) == datetime(2024, 6, 1, 12, 15, tzinfo=UTC)
    assert schedule.latest_fire(at) == datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    assert schedule.due_fire(at) == datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    assert schedule.when == "every 15m"


def test_add_schedules_from_configuration(bare: Akadze) -> None:
    made = bare.add_schedules([
        {"name": "a", "task": "report", "cron": "@hourly", "args": {"copies": 2}},
        {"name": "b", "task": "report", "every": "90s", "priority": 5, "grace": 600},
    ])
    assert [s.name for s in made] == ["a", "b"]
    assert bare.schedules["a"].args == {"copies": 2}
    assert bare.schedules["b"].every == timedelta(seconds=90)
    assert bare.schedules["b"].grace == timedelta(minutes=10)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"task": "report", "cron": "61 * * * *"}, "Bad minute"),
    ({"task": "report", "cron": "* * * *"}, "has 4 fields"),
    ({"task": "report", "every": timedelta(0)}, "every must be positive"),
    ({"task": "report", "every": -5}, "every must be positive"),
    ({"task": "report", "every": timedelta(milliseconds=10)}, "at least one second"),
    ({"task": "report", "cron": "0 * * * *", "timezone": "Mars/Base"}, "unknown time zone"),
    ({"task": "report", "every": 60, "timezone": "UTC"}, "timezone applies to cron"),
    ({"task": "nope", "cron": "0 * * * *"}, "no task named 'nope'"),
    ({"task": "report"}, "give cron"),
    ({"task": "report", "cron": "0 * * * *", "every": 60}, "not both"),
    ({"task": "report", "cron": "0 * * * *", "args": {"pages": 3}}, "unexpected argument"),
    ({"task": "report", "cron": "0 * * * *", "args": {"copies": "many"}}, "copies"),
    ({"task": "report", "cron": "0 * * * *", "priority": 10**6}, "priority"),
    ({"task": "report", "cron": "0 * * * *", "overlap": "no"}, "overlap"),
    ({"task": "report", "cron": "0 * * * *", "grace": "soon"}, "not a duration"),
    # What jsonb cannot store is refused at registration, as enqueue refuses it: a
    # schedule that is accepted can enqueue every one of its fires.
    ({"task": "report", "cron": "0 * * * *", "args": {"day": "mon\x00day"}}, "NUL character"),
    ({"task": "report", "cron": "0 * * * *", "meta": {"k": float("nan")}}, "NaN"),
]


@pytest.mark.parametrize(("options", "message"), BAD)
def test_add_schedule_refuses(bare: Akadze, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as info:
        bare.add_schedule("bad", **options)
    assert "schedule 'bad'" in str(info.value)
    assert bare.schedules == {}


def test_add_schedules_is_all_or_nothing(bare: Akadze) -> None:
    with pytest.raises(ScheduleError, match="schedule 'second': unknown key\\(s\\) crontab"):
        bare.add_schedules([
            {"name": "first", "task": "report", "cron": "@daily"},
            {"name": "second", "task": "report", "crontab": "@daily"},
        ])
    with pytest.raises(ScheduleError, match="'x': defined twice"):
        bare.add_schedules([
            {"name": "x", "task": "report", "cron": "@daily"},
            {"name": "x", "task": "report", "cron": "@daily"},
        ])
    with pytest.raises(ScheduleError, match="'name' is required"):
        bare.add_schedules([{"task": "report", "cron": "@daily"}])
    with pytest.raises(ScheduleError, match="list of mappings"):
        bare.add_schedules({"name": "x"})  # type: ignore[arg-type]
    assert bare.schedules == {}


def test_unknown_option_and_duplicates(bare: Akadze) -> None:
    with pytest.raises(ScheduleError, match="unknown option\\(s\\) tz"):
        bare.add_schedule("x", task="report", cron="@daily", tz="UTC")
    bare.add_schedule("x", task="report", cron="@daily")
    with pytest.raises(ScheduleError, match="already registered"):
        bare.add_schedule("x", task="report", cron="@hourly")


def test_periodic_refuses_and_registers_nothing(bare: Akadze) -> None:
    with pytest.raises(ScheduleError, match="Bad hour"):

        @bare.periodic("broken", cron="0 25 * * *")
        def broken() -> None:
            return None

    with pytest.raises(ScheduleError, match="unexpected argument 'x'"):

        @bare.periodic("broken", every=60, args={"x": 1})
        def broken_args() -> None:
            return None

    with pytest.raises(ScheduleError, match="task of that name is already registered"):

        @bare.periodic("report", every=60)
        def clash() -> None:
            return None

    with pytest.raises(ScheduleError, match="max_attempts"):

        @bare.periodic("broken", every=60, max_attempts=0)
        def bad_task() -> None:
            return None

    assert "broken" not in bare.tasks and bare.schedules == {}


@pytest.mark.parametrize("expr", ["*/7 * * * *", "30 2 * * *", "* 1 * * *", "0 0 * * 0"])
def test_due_fire_memo_agrees_with_a_fresh_computation(bare: Akadze, expr: str) -> None:
    schedule = bare.add_schedule("s", task="report", cron=expr, timezone="Europe/Berlin",
                                 grace=timedelta(minutes=20))
    now = datetime(2024, 10, 26, 22, 0, tzinfo=UTC)  # across the October transition
    step = 0
    while now < datetime(2024, 10, 27, 6, 0, tzinfo=UTC):
        fresh = schedule.latest_fire(now)
        expected = fresh if fresh is not None and now - fresh <= schedule.grace else None
        assert schedule.due_fire(now) == expected, now
        step = (step * 7 + 13) % 97
        now += timedelta(seconds=5 + step * 11)


def test_arguments_are_checked_as_enqueue_checks_them(bare: Akadze) -> None:
    @bare.task("anything")
    def anything(value: Any = None) -> None:
        return None

    for value, message in ((float("nan"), "NaN or Infinity"), ({"k": "a\x00"}, "NUL character"),
                           ([1, float("inf")], "NaN or Infinity")):
        with pytest.raises(ScheduleError, match=message) as refused:
            bare.add_schedule("odd", task="anything", every=60, args={"value": value})
        assert "schedule 'odd': task 'anything': argument 'value'" in str(refused.value)
        with pytest.raises(EnqueueError, match=message):
            anything.using().enqueue_sync(value=value)  # the same refusal, the same path
    assert bare.schedules == {}
    accepted = bare.add_schedule("odd", task="anything", every=60, args={"value": [1.5, "x"]})
    assert accepted.args == {"value": [1.5, "x"]}
