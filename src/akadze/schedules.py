"""Periodic schedules: register them on the app, enqueue their due fires from every worker.

A schedule names a registered task and when to run it: a five-field ``cron`` expression
on a time zone's wall clock (see :mod:`akadze.cron` for the daylight-saving rules), or a
fixed interval ``every=timedelta(...)`` counted from the Unix epoch in UTC (so every
process agrees on the fire times: ``every=timedelta(minutes=15)`` fires at :00, :15,
:30 and :45).

Every worker calls :func:`enqueue_due` periodically. For each schedule it looks at the
*latest* fire at or before ``now``:

- if that fire is older than the schedule's ``grace`` (default one hour) it is skipped;
- fires before the latest one are never enqueued: after downtime only the latest
  missed fire runs, and only within the grace;
- the fire is recorded in ``akadze.periodic_fires`` (primary key schedule, fire_at) in
  the same transaction as its job, so it is enqueued exactly once however many workers
  race for it;
- with ``overlap=False`` a fire is recorded without a job (skipped) while the job of
  the schedule's previous fire is still queued or running.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from . import cron, queries
from .errors import AkadzeError, ScheduleError

if TYPE_CHECKING:
    from .app import Akadze
    from .enqueue import Enqueuer
    from .tasks import Task

__all__ = ["Schedule", "enqueue_due", "enqueue_due_sync"]

logger = logging.getLogger("akadze.schedules")

DEFAULT_GRACE = timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAME_MAX = 200

# The keys a configuration mapping of add_schedules may carry.
SCHEDULE_KEYS = frozenset({
    "name", "task", "cron", "every", "timezone", "overlap", "grace", "args", "queue",
    "priority", "max_attempts", "limit_key", "meta",
})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule as registered on the app."""

    name: str
    task: str
    cron: cron.CronExpression | None
    every: timedelta | None
    timezone: str | None
    overlap: bool
    grace: timedelta
    args: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    limit_key: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # [asked at, latest fire then, the fire after it]: due_fire's memo between ticks.
    _due_cache: list[Any] = field(default_factory=list, compare=False, repr=False)

    @property
    def when(self) -> str:
        """``cron 0 3 * * * (Europe/Berlin)`` or ``every 15m``, for people."""
        if self.cron is not None:
            return f"cron {self.cron.text} ({self.timezone})"
        assert self.every is not None
        return f"every {format_interval(self.every)}"

    def next_fire(self, after: datetime) -> datetime | None:
        """The first fire strictly after ``after`` (aware UTC), None if it never fires."""
        if self.cron is not None:
            return cron.next_fire(self.cron, cron.zone(self.timezone or "UTC"), after)
        assert self.every is not None
        steps = (after - EPOCH) // self.every
        return EPOCH + (steps + 1) * self.every

    def latest_fire(self, at: datetime) -> datetime | None:
        """The latest fire at or before ``at``."""
        if self.cron is not None:
            tz = cron.zone(self.timezone or "UTC")
            return cron.latest_fire(self.cron, tz, at, since=at - self.grace)
        assert self.every is not None
        return EPOCH + ((at - EPOCH) // self.every) * self.every

    def due_fire(self, now: datetime) -> datetime | None:
        """The fire to enqueue at ``now``: the latest one, if within the grace."""
        cached = self._due_cache
        fire: datetime | None
        if cached and cached[0] <= now and (cached[2] is None or now < cached[2]):
            fire = cached[1]  # no fire since the last call: same answer, no cron work
        else:
            fire = self.latest_fire(now)
            following = self.next_fire(fire if fire is not None else now)
            cached[:] = [now, fire, following]
        if fire is None or now - fire > self.grace:
            return None
        return fire

    def job_meta(self) -> dict[str, Any]:
        return {"schedule": self.name, **self.meta}


def format_interval(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- building and validating ----------------------------------------------------------


def _refuse(name: object, message: str) -> ScheduleError:
    shown = repr(name) if isinstance(name, str) and name else "(unnamed)"
    return ScheduleError(f"schedule {shown}: {message}")


def _interval(name: str, key: str, value: object) -> timedelta:
    if isinstance(value, timedelta):
        interval = value
    elif isinstance(value, bool):
        raise _refuse(name, f"{key} must be a timedelta, a number of seconds or '15m', "
                            f"got {value!r}")
    elif isinstance(value, int | float):
        try:
            interval = timedelta(seconds=value)
        except (OverflowError, ValueError):
            raise _refuse(name, f"{key} {value!r} is out of range") from None
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise _refuse(name, f"{key} {value!r} is not a duration (use 30s, 15m, 1h, 1d)")
        interval = timedelta(seconds=float(match.group(1)) * _UNIT[match.group(2)])
    else:
        raise _refuse(name, f"{key} must be a timedelta, a number of seconds or '15m', "
                            f"got {type(value).__name__}")
    if interval < timedelta(seconds=1):
        raise _refuse(name, f"{key} must be at least one second, got {format_interval(interval)}"
                      if interval > timedelta(0) else f"{key} must be positive, got {value!r}")
    return interval


def build(
    app: Akadze,
    name: str,
    *,
    task: str | Task[Any],
    cron: str | None = None,
    every: timedelta | float | str | None = None,
    timezone: str | None = None,
    overlap: bool = True,
    grace: timedelta | float | str | None = None,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    limit_key: str | None = None,
    meta: Mapping[str, Any] | None = None,
    task_object: Task[Any] | None = None,
) -> Schedule:
    """A checked :class:`Schedule`; raises ScheduleError naming what is wrong. Registers
    nothing. ``task_object`` is the task to check against when it is not registered yet
    (``@app.periodic``)."""
    from .tasks import Task

    if not isinstance(name, str) or not name.strip():
        raise _refuse(name, "a schedule needs a non-empty name")
    if len(name) > NAME_MAX or "\x00" in name:
        raise _refuse(name, f"the name must be at most {NAME_MAX} characters, without NUL")
    if name in app.schedules:
        raise _refuse(name, "a schedule of that name is already registered")
    task_name = task.name if isinstance(task, Task) else task
    if task_object is None:
        if not isinstance(task_name, str) or task_name not in app.tasks:
            raise _refuse(name, f"no task named {task_name!r} is registered")
        task_object = app.tasks[task_name]
    expression, interval = _when(name, cron, every, timezone)
    if not isinstance(overlap, bool):
        raise _refuse(name, f"overlap must be True or False, got {overlap!r}")
    checked_grace = DEFAULT_GRACE if grace is None else _interval(name, "grace", grace)
    if args is not None and not isinstance(args, Mapping):
        raise _refuse(name, f"args must be a mapping of argument names, got {type(args).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise _refuse(name, f"meta must be a mapping, got {type(meta).__name__}")
    try:
        json_args = task_object.validate_args(dict(args or {}))
        from .jobspec import build_options

        options = build_options(
            task_object, priority=priority, max_attempts=max_attempts, limit_key=limit_key,
            meta={"schedule": name, **(meta or {})}, queue=queue,
        )
    except AkadzeError as exc:
        raise _refuse(name, str(exc)) from None
    return Schedule(
        name=name,
        task=task_object.name,
        cron=expression,
        every=interval,
        timezone=(timezone or "UTC") if expression is not None else None,
        overlap=overlap,
        grace=checked_grace,
        args=json_args,
        queue=None if queue is None else options.queue,
        priority=priority,
        max_attempts=max_attempts,
        limit_key=limit_key,
        meta=dict(meta or {}),
    )


def _when(
    name: str, expression: object, every: object, timezone: object
) -> tuple[cron.CronExpression | None, timedelta | None]:
    if expression is None and every is None:
        raise _refuse(name, "give cron='...' or every=timedelta(...)")
    if expression is not None and every is not None:
        raise _refuse(name, "give cron or every, not both")
    if every is not None:
        if timezone is not None:
            raise _refuse(name, "timezone applies to cron schedules only; an every= interval "
                                "is counted in UTC from the Unix epoch")
        return None, _interval(name, "every", every)
    if not isinstance(expression, str):
        raise _refuse(name, f"cron must be a string, got {type(expression).__name__}")
    try:
        parsed = cron.parse(expression)
        if timezone is not None:
            if not isinstance(timezone, str):
                raise cron.CronError(f"timezone must be a string, got {timezone!r}")
            cron.zone(timezone)
    except cron.CronError as exc:
        raise _refuse(name, str(exc)) from None
    return parsed, None


def add_schedule(app: Akadze, name: str, **options: Any) -> Schedule:
    """Check and register one schedule (see :meth:`Akadze.add_schedule`)."""
    unknown = sorted(set(options) - (SCHEDULE_KEYS - {"name"}))
    if unknown:
        raise _refuse(name, f"unknown option(s) {', '.join(unknown)}; "
                            f"known: {', '.join(sorted(SCHEDULE_KEYS - {'name'}))}")
    if "task" not in options:
        raise _refuse(name, "task= is required (the name of a registered task)")
    schedule = build(app, name, **options)
    app.schedules[name] = schedule
    return schedule


def add_schedules(app: Akadze, items: Iterable[Mapping[str, Any]]) -> list[Schedule]:
    """Check every mapping, then register them all (or none)."""
    if isinstance(items, Mapping | str | bytes):
        raise ScheduleError("add_schedules takes a list of mappings, one per schedule")
    built: list[Schedule] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ScheduleError(f"schedule #{index + 1}: expected a mapping, "
                                f"got {type(item).__name__}")
        name = item.get("name")
        label = name if isinstance(name, str) and name else f"#{index + 1}"
        unknown = sorted(str(key) for key in item if key not in SCHEDULE_KEYS)
        if unknown:
            raise ScheduleError(f"schedule {label!r}: unknown key(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(SCHEDULE_KEYS))}")
        if not isinstance(name, str) or not name:
            raise ScheduleError(f"schedule {label}: 'name' is required")
        if "task" not in item:
            raise ScheduleError(f"schedule {name!r}: 'task' is required")
        if name in seen:
            raise ScheduleError(f"schedule {name!r}: defined twice")
        seen.add(name)
        options = {key: value for key, value in item.items() if key != "name"}
        built.append(build(app, name, **options))
    for schedule in built:
        app.schedules[schedule.name] = schedule
    return built


def periodic(
    app: Akadze,
    name: str,
    *,
    task_options: Mapping[str, Any],
    schedule_options: Mapping[str, Any],
) -> Callable[[Callable[..., Any]], Task[Any]]:
    """The decorator behind :meth:`Akadze.periodic`."""
    from .tasks import Task

    if callable(name):
        raise ScheduleError("@app.periodic needs a name, e.g. @app.periodic(\"nightly\", "
                            "cron=\"0 3 * * *\")")

    def decorate(fn: Callable[..., Any]) -> Task[Any]:
        if isinstance(name, str) and name in app.tasks:
            raise _refuse(name, "a task of that name is already registered")
        try:
            candidate: Task[Any] = Task(app, fn, name=name, **task_options)
        except AkadzeError as exc:
            raise _refuse(name, str(exc)) from None
        schedule = build(app, name, task=name, task_object=candidate, **schedule_options)
        task = app.register(fn, name=name, **task_options)
        app.schedules[name] = schedule
        return task

    return decorate


# -- enqueueing due fires --------------------------------------------------------------


def _lock_key(schedule: Schedule) -> str:
    return f"akadze.periodic:{schedule.name}"


def _due(app: Akadze, now: datetime) -> list[tuple[Schedule, datetime]]:
    due = []
    for schedule in app.schedules.values():
        if not isinstance(schedule, Schedule):
            continue
        fire = schedule.due_fire(now)
        if fire is not None:
            due.append((schedule, fire))
    return due


async def enqueue_due(
    conn: psycopg.AsyncConnection[Any], app: Akadze, now: datetime
) -> list[int]:
    """Enqueue the due fire of every schedule of ``app`` that no one enqueued yet;
    return the new job ids. ``conn`` is an autocommit connection outside any
    transaction; each fire gets a transaction of its own. Safe to run from any number
    of processes at once."""
    if now.tzinfo is None:
        raise ValueError("enqueue_due needs a timezone-aware now")
    due = _due(app, now)
    if not due:
        return []
    cur = await conn.execute(
        queries.get("periodic_recorded"),
        {"names": [s.name for s, _ in due], "fires": [f for _, f in due]},
    )
    recorded = {(str(row[0]), row[1]) for row in await cur.fetchall()}
    ids: list[int] = []
    for schedule, fire in due:
        if (schedule.name, fire) in recorded:
            continue
        try:
            job_id = await _fire(conn, app, schedule, fire)
        except psycopg.Error:
            raise
        except Exception:
            logger.exception("schedule %r: could not enqueue the fire of %s",
                             schedule.name, fire.isoformat())
            continue
        if job_id is not None:
            ids.append(job_id)
    return ids


async def _fire(
    conn: psycopg.AsyncConnection[Any], app: Akadze, schedule: Schedule, fire: datetime
) -> int | None:
    params = {"schedule": schedule.name, "fire_at": fire, "key": _lock_key(schedule)}
    async with conn.transaction():
        if not schedule.overlap:
            # Serialise the decisions of this schedule, so that the check below sees
            # the job of any fire decided just before.
            await conn.execute(queries.get("periodic_lock"), params)
        cur = await conn.execute(queries.get("periodic_record_fire"), params)
        if await cur.fetchone() is None:
            return None  # another process recorded this fire
        if not schedule.overlap:
            cur = await conn.execute(queries.get("periodic_previous_active"), params)
            if await cur.fetchone() is not None:
                logger.info("schedule %r: fire of %s skipped, the previous run is still "
                            "queued or running", schedule.name, fire.isoformat())
                return None  # recorded without a job: skipped
        job_id = await _enqueuer(app, schedule, conn).enqueue(**schedule.args)
        await conn.execute(queries.get("periodic_set_job"), {**params, "job_id": job_id})
    return job_id


def enqueue_due_sync(conn: psycopg.Connection[Any], app: Akadze, now: datetime) -> list[int]:
    """The sync twin of :func:`enqueue_due` (an autocommit psycopg ``Connection``)."""
    if now.tzinfo is None:
        raise ValueError("enqueue_due needs a timezone-aware now")
    due = _due(app, now)
    if not due:
        return []
    recorded = {
        (str(row[0]), row[1])
        for row in conn.execute(
            queries.get("periodic_recorded"),
            {"names": [s.name for s, _ in due], "fires": [f for _, f in due]},
        ).fetchall()
    }
    ids: list[int] = []
    for schedule, fire in due:
        if (schedule.name, fire) in recorded:
            continue
        params = {"schedule": schedule.name, "fire_at": fire, "key": _lock_key(schedule)}
        with conn.transaction():
            if not schedule.overlap:
                conn.execute(queries.get("periodic_lock"), params)
            if conn.execute(queries.get("periodic_record_fire"), params).fetchone() is None:
                continue
            if not schedule.overlap and conn.execute(
                queries.get("periodic_previous_active"), params
            ).fetchone() is not None:
                continue
            job_id = _enqueuer(app, schedule, conn).enqueue_sync(**schedule.args)
            conn.execute(queries.get("periodic_set_job"), {**params, "job_id": job_id})
        ids.append(job_id)
    return ids


def _enqueuer(app: Akadze, schedule: Schedule, conn: Any) -> Enqueuer:
    task = app.get_task(schedule.task)
    return task.using(
        session=conn,
        queue=schedule.queue,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts,
        limit_key=schedule.limit_key,
        meta=schedule.job_meta(),
    )


# -- reporting ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleSummary:
    """A schedule with its next fire and its most recent recorded fire."""

    name: str
    task: str
    when: str
    overlap: bool
    next_fire: datetime | None
    last_fire: datetime | None = None
    last_job_id: int | None = None


def summaries(app: Akadze, now: datetime) -> list[ScheduleSummary]:
    """Every schedule of ``app`` with its next fire after ``now`` (no database)."""
    return [
        ScheduleSummary(s.name, s.task, s.when, s.overlap, s.next_fire(now))
        for s in sorted(app.schedules.values(), key=lambda s: s.name)
        if isinstance(s, Schedule)
    ]
