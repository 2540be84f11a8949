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
  the schedule's previous fire is still queued or running;
- a fire that cannot be enqueued (an on_enqueue hook raising, say) is logged and left
  unrecorded, and the other schedules go on; the next tick tries it again.

A schedule's job arguments and options are checked at registration through the same
path as an enqueue (akadze.arguments, akadze.jobspec) and kept checked, so every fire
of an accepted schedule can be enqueued. ``enqueue_due`` and ``enqueue_due_sync`` are
two thin calls of one dialog (akadze.dialog).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, Required

import psycopg

from . import arguments, cron, dialog, queries
from .dialog import Dialog
from .enqueue import insert_one
from .errors import AkadzeError, ScheduleError
from .hooks import Hook
from .jobspec import Options, Pending, PlacementOptions, build_options
from .tasks import Task

__all__ = ["Schedule", "ScheduleOptions", "enqueue_due", "enqueue_due_sync"]

logger = logging.getLogger("akadze.schedules")

DEFAULT_GRACE = timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAME_MAX = 200

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


class WhenOptions(PlacementOptions, total=False):
    """When a schedule fires, and what its jobs get: the options of ``@app.periodic``
    besides the task's own (its jobs' ``queue``, ``priority`` and ``max_attempts`` are
    the task's there)."""

    cron: str | None
    every: timedelta | float | str | None
    timezone: str | None
    overlap: bool
    grace: timedelta | float | str | None
    args: Mapping[str, Any] | None


class ScheduleOptions(WhenOptions, total=False):
    """The options of ``app.add_schedule(name, ...)``: the task to run, when, and the
    options of its jobs."""

    task: Required[str | Task[Any]]


# The keys a configuration mapping of add_schedules may carry.
SCHEDULE_KEYS = frozenset(
    {"name"} | ScheduleOptions.__required_keys__ | ScheduleOptions.__optional_keys__)
@dataclass(frozen=True)
class Schedule:
    """A periodic schedule as registered on the app (built by :func:`build`)."""

    name: str
    task: str
    cron: cron.CronExpression | None
    every: timedelta | None
    timezone: str | None
    overlap: bool
    grace: timedelta
    args: dict[str, Any]
    # The options of its jobs, checked with the task's defaults filled in (their meta
    # carries "schedule": name), and the checked JSON text of the arguments: a fire
    # enqueues exactly what registration accepted.
    options: Options
    args_json: str = field(repr=False)
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


def format_interval(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- building and validating ----------------------------------------------------------


def refuse(name: object, message: str) -> ScheduleError:
    """The ScheduleError of schedule ``name``: ``schedule 'name': message``."""
    shown = repr(name) if isinstance(name, str) and name else "(unnamed)"
    return ScheduleError(f"schedule {shown}: {message}")


def _interval(name: str, key: str, value: object) -> timedelta:
    if isinstance(value, timedelta):
        interval = value
    elif isinstance(value, bool):
        raise refuse(name, f"{key} must be a timedelta, a number of seconds or '15m', "
                            f"got {value!r}")
    elif isinstance(value, int | float):
        try:
            interval = timedelta(seconds=value)
        except (OverflowError, ValueError):
            raise refuse(name, f"{key} {value!r} is out of range") from None
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise refuse(name, f"{key} {value!r} is not a duration (use 30s, 15m, 1h, 1d)")
        interval = timedelta(seconds=float(match.group(1)) * _UNIT[match.group(2)])
    else:
        raise refuse(name, f"{key} must be a timedelta, a number of seconds or '15m', "
                            f"got {type(value).__name__}")
    if interval < timedelta(seconds=1):
        raise refuse(name, f"{key} must be at least one second, got {format_interval(interval)}"
                      if interval > timedelta(0) else f"{key} must be positive, got {value!r}")
    return interval


def build(
    name: object,
    options: Mapping[str, Any],
    *,
    tasks: Mapping[str, Task[Any]],
    taken: Container[str],
    task: Task[Any] | None = None,
) -> Schedule:
    """A checked :class:`Schedule` named ``name`` from ``options`` (a ScheduleOptions, or
    a WhenOptions with ``task``); raises ScheduleError naming what is wrong. Registers
    nothing. ``tasks``: the registered tasks (``options["task"]`` names one);
    ``taken``: the names of the registered schedules; ``task``: the task to check
    against when it is not registered yet (``@app.periodic``)."""
    if not isinstance(name, str) or not name.strip():
        raise refuse(name, "a schedule needs a non-empty name")
    if len(name) > NAME_MAX or "\x00" in name:
        raise refuse(name, f"the name must be at most {NAME_MAX} characters, without NUL")
    if name in taken:
        raise refuse(name, "a schedule of that name is already registered")
    if task is None:
        wanted = options.get("task")
        task_name = wanted.name if isinstance(wanted, Task) else wanted
        if not isinstance(task_name, str) or task_name not in tasks:
            raise refuse(name, f"no task named {task_name!r} is registered")
        task = tasks[task_name]
    expression, interval = _when(name, options.get("cron"), options.get("every"),
                                 options.get("timezone"))
    overlap = options.get("overlap", True)
    if not isinstance(overlap, bool):
        raise refuse(name, f"overlap must be True or False, got {overlap!r}")
    grace = options.get("grace")
    checked_grace = DEFAULT_GRACE if grace is None else _interval(name, "grace", grace)
    args, meta = options.get("args"), options.get("meta")
    if args is not None and not isinstance(args, Mapping):
        raise refuse(name, f"args must be a mapping of argument names, got {type(args).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise refuse(name, f"meta must be a mapping, got {type(meta).__name__}")
    try:  # the checks of an enqueue, once, here
        args_json = arguments.serialize_args(task, dict(args or {}),
                                             max_bytes=task.app.max_args_bytes)
        job_options = build_options(task, {**options, "meta": {"schedule": name, **(meta or {})}})
    except AkadzeError as exc:
        raise refuse(name, str(exc)) from None
    timezone = options.get("timezone")
    return Schedule(
        name=name,
        task=task.name,
        cron=expression,
        every=interval,
        timezone=(timezone or "UTC") if expression is not None else None,
        overlap=overlap,
        grace=checked_grace,
        args=json.loads(args_json),
        options=job_options,
        args_json=args_json,
    )


def _when(
    name: str, expression: object, every: object, timezone: object
) -> tuple[cron.CronExpression | None, timedelta | None]:
    if expression is None and every is None:
        raise refuse(name, "give cron='...' or every=timedelta(...)")
    if expression is not None and every is not None:
        raise refuse(name, "give cron or every, not both")
    if every is not None:
        if timezone is not None:
            raise refuse(name, "timezone applies to cron schedules only; an every= interval "
                                "is counted in UTC from the Unix epoch")
        return None, _interval(name, "every", every)
    if not isinstance(expression, str):
        raise refuse(name, f"cron must be a string, got {type(expression).__name__}")
    try:
        parsed = cron.parse(expression)
        if timezone is not None:
            if not isinstance(timezone, str):
                raise cron.CronError(f"timezone must be a string, got {timezone!r}")
            cron.zone(timezone)
    except cron.CronError as exc:
        raise refuse(name, str(exc)) from None
    return parsed, None


def from_options(
    name: str, options: Mapping[str, Any], *, tasks: Mapping[str, Task[Any]],
    taken: Container[str],
) -> Schedule:
    """The schedule of ``app.add_schedule(name, **options)``, checked."""
    known = SCHEDULE_KEYS - {"name"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise refuse(name, f"unknown option(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(known))}")
    if "task" not in options:
        raise refuse(name, "task= is required (the name of a registered task)")
    return build(name, options, tasks=tasks, taken=taken)


def from_entries(
    items: Iterable[Mapping[str, Any]], *, tasks: Mapping[str, Task[Any]],
    taken: Container[str],
) -> list[Schedule]:
    """The schedules of ``app.add_schedules(items)``, every one checked (before the
    app registers any)."""
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
        built.append(build(name, options, tasks=tasks, taken=taken))
    return built


# -- enqueueing due fires --------------------------------------------------------------


class ScheduledApp(Protocol):
    """The app as enqueueing its fires sees it (akadze.Akadze is one)."""

    @property
    def schedules(self) -> Mapping[str, Schedule]: ...

    @property
    def on_enqueue_hooks(self) -> Sequence[Hook]: ...


def _lock_key(schedule: Schedule) -> str:
    return f"akadze.periodic:{schedule.name}"


def _due(app: ScheduledApp, now: datetime) -> list[tuple[Schedule, datetime]]:
    due = []
    for schedule in app.schedules.values():
        fire = schedule.due_fire(now)
        if fire is not None:
            due.append((schedule, fire))
    return due


def _enqueue_due(app: ScheduledApp, now: datetime) -> Dialog[list[int]]:
    """Both enqueue_due and its sync twin: one dialog."""
    if now.tzinfo is None:
        raise ValueError("enqueue_due needs a timezone-aware now")
    due = _due(app, now)
    if not due:
        return []
    recorded = {
        (str(row[0]), row[1])
        for row in (yield from dialog.rows(
            queries.get("periodic_recorded"),
            {"names": [s.name for s, _ in due], "fires": [f for _, f in due]}))
    }
    ids: list[int] = []
    for schedule, fire in due:
        if (schedule.name, fire) in recorded:
            continue
        try:  # each fire in a transaction of its own: a failure rolls back its record
            job_id = yield from dialog.transaction(_fire(app, schedule, fire))
        except psycopg.Error:
            raise  # the connection may be unusable: the caller (a worker) reconnects
        except Exception:
            logger.exception("schedule %r: could not enqueue the fire of %s",
                             schedule.name, fire.isoformat())
            continue
        if job_id is not None:
            ids.append(job_id)
    return ids


def _fire(app: ScheduledApp, schedule: Schedule, fire: datetime) -> Dialog[int | None]:
    params = {"schedule": schedule.name, "fire_at": fire, "key": _lock_key(schedule)}
    if not schedule.overlap:
        # Serialise the decisions of this schedule, so that the check below sees
        # the job of any fire decided just before.
        yield from dialog.execute(queries.get("periodic_lock"), params)
    if (yield from dialog.one(queries.get("periodic_record_fire"), params)) is None:
        return None  # another process recorded this fire
    if not schedule.overlap and (
        yield from dialog.one(queries.get("periodic_previous_active"), params)
    ) is not None:
        logger.info("schedule %r: fire of %s skipped, the previous run is still "
                    "queued or running", schedule.name, fire.isoformat())
        return None  # recorded without a job: skipped
    pending = Pending(task=schedule.task, args_json=schedule.args_json, options=schedule.options)
    # In the fire's transaction, as an enqueue joined to it: a savepoint only for hooks.
    hooks = list(app.on_enqueue_hooks)
    job_id = yield from insert_one(pending, hooks, guard=bool(hooks))
    yield from dialog.execute(queries.get("periodic_set_job"), {**params, "job_id": job_id})
    return job_id


async def enqueue_due(
    conn: psycopg.AsyncConnection[Any], app: ScheduledApp, now: datetime
) -> list[int]:
    """Enqueue the due fire of every schedule of ``app`` that no one enqueued yet;
    return the new job ids. ``conn`` is an autocommit connection outside any
    transaction; each fire gets a transaction of its own. A fire that cannot be
    enqueued is logged and skipped (the next call tries it again). Safe to run from
    any number of processes at once."""
    return await dialog.run_async(conn, _enqueue_due(app, now))


def enqueue_due_sync(conn: psycopg.Connection[Any], app: ScheduledApp, now: datetime
                     ) -> list[int]:
    """The sync twin of :func:`enqueue_due` (an autocommit psycopg ``Connection``)."""
    return dialog.run_sync(conn, _enqueue_due(app, now))
