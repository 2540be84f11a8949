"""Jobs to be enqueued, checked: their options, and the COPY rows of a bulk insert. Pure
code (no I/O), shared by the sync and async enqueue paths and by schedules.

The enqueue options are listed once, as typed dicts: :class:`PlacementOptions` (what a
schedule can give its jobs too), :class:`JobOptions` (an item of ``enqueue_many``,
:class:`Job`) and :class:`EnqueueOptions` (``task.using(...)``). :func:`build_options`
checks them into an :class:`Options`, task defaults filled in. Arguments are checked
by :mod:`akadze.arguments`.

Every check raises :class:`~akadze.errors.EnqueueError` naming the field, before any
statement is sent, so that a refused enqueue inserts nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict, Unpack, cast

from . import arguments, names
from .arguments import HasArguments
from .clock import Clock
from .errors import EnqueueError
from .jobs import EnqueuedJob

# meta is a small label, GIN-indexed: its compact JSON form (UTF-8) is capped.
META_MAX_BYTES = 8 * 1024
META_MAX_DEPTH = 32
# Python writes floats from 1e16 up in exponent form; jsonb keeps such a number as
# an integral numeric and hands it back as a (different) Python int. Below it, a
# float comes back exactly.
FLOAT_EXACT_LIMIT = 1e16
# Rows per chunk handed to COPY: the next chunk is formatted while the server
# ingests the previous one.
COPY_CHUNK_ROWS = 5_000
# The columns of a smallint priority and an integer max_attempts.
PRIORITY_MIN, PRIORITY_MAX = -32768, 32767
MAX_ATTEMPTS_MAX = 2**31 - 1

_NO_DELAY = timedelta(0)

# -- the options, listed once --------------------------------------------------------------


class PlacementOptions(TypedDict, total=False):
    """Where and how a job runs: the options a schedule gives its jobs too."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    limit_key: str | None
    meta: Mapping[str, Any] | None


class JobOptions(PlacementOptions, total=False):
    """The options of one job of a bulk insert (:class:`Job`).

    ``unique_key`` with ``unique_for`` and ``on_duplicate`` (``"raise"``, ``"ignore"``,
    ``"replace"``; ``keep_run_at`` with "replace") make a job unique over time
    (akadze.uniqueness); ``after`` names the jobs it waits for (ids, or the
    :class:`Job` items of the same ``enqueue_many`` call) and ``after_policy`` what
    a failed or cancelled parent does to it (``"cancel"``, the default, or ``"run"``).
    """

    delay: timedelta | float | None
    run_at: datetime | None
    expires_at: datetime | None
    unique_key: str | None
    unique_for: timedelta | float | None
    on_duplicate: str | None
    keep_run_at: bool | None
    after: Sequence[int | Job] | None
    after_policy: str | None


class EnqueueOptions(JobOptions, total=False):
    """The options of ``task.using(...)``: those of a job (the defaults of every item of
    an ``enqueue_many``)."""


def check_option_names(given: Mapping[str, object], allowed: type[Any], where: str) -> None:
    """Refuse option names ``allowed`` (one of the typed dicts above) does not list, as
    Python refuses an unknown keyword argument."""
    known: frozenset[str] = allowed.__required_keys__ | allowed.__optional_keys__
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"{where} got an unexpected keyword argument {unknown[0]!r}")


@dataclass(frozen=True, init=False)
class Job:
    """One item of ``enqueue_many`` with options of its own::

        Job({"name": "ada"}, limit_key="acme", priority=5)

    Options left out (``None``) take the enqueuer's, then the task's. ``delay`` or
    ``run_at`` given here replace both of the enqueuer's. ``after`` may name other
    items of the same call (their Job objects), so that a whole graph is one call.

    ``task`` (a registered task, or its name) is the task whose job this is: it is
    what ``app.enqueue_many`` needs of each item, so that one call inserts a graph
    of jobs of several tasks; ``task.job(args, **options)`` makes the same item.
    """

    args: Mapping[str, Any]
    options: JobOptions
    task: TaskSpec | str | None

    def __init__(self, args: Mapping[str, Any] | None = None, *,
                 task: TaskSpec | str | None = None,
                 **options: Unpack[JobOptions]) -> None:
        check_option_names(options, JobOptions, "Job()")
        if task is not None and not isinstance(task, str) and not hasattr(task, "args_type"):
            raise EnqueueError(f"Job(task=...) takes a registered task or its name, got "
                               f"{type(task).__name__}", field="task")
        after = options.get("after")
        if after is not None and not isinstance(after, str | bytes | Mapping):
            # a copy: the graph of a call is fixed when its items are made
            copied = tuple(after) if isinstance(after, Iterable) else after
            options = cast(JobOptions, {**options, "after": copied})
        object.__setattr__(self, "args", {} if args is None else args)
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "task", task)


@dataclass(frozen=True, slots=True)
class Options:
    """Checked enqueue options, task defaults filled in."""

    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    delay: timedelta
    limit_key: str | None
    unique_key: str | None
    expires_at: datetime | None
    meta: dict[str, Any]
    meta_json: str
    unique_for: timedelta | None = None
    on_duplicate: str = "raise"
    keep_run_at: bool = False
    after: tuple[int | Job, ...] = ()
    after_policy: str = "cancel"

    def ready_at(self, now: datetime) -> datetime:
        """When the job becomes ready, given the database time of the insert."""
        return self.run_at if self.run_at is not None else now + self.delay

    @property
    def scheduled(self) -> bool:
        """Whether the job has a run_at other than the insert time."""
        return self.run_at is not None or self.delay != _NO_DELAY


class _AppSettings(Protocol):
    """What building jobs needs of the app: its clock and its size limit of arguments."""

    @property
    def clock(self) -> Clock: ...

    @property
    def max_args_bytes(self) -> int: ...


class TaskSpec(HasArguments, Protocol):
    """A task as building its jobs sees it (akadze.Task is one): its name, argument
    type, defaults, and the clock of its app (for the range of a delay)."""

    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def max_attempts(self) -> int: ...

    @property
    def app(self) -> _AppSettings: ...


def _refuse(where: str, message: str, field: str | None) -> EnqueueError:
    return EnqueueError(f"{where}{message}", field=field)


# -- options ------------------------------------------------------------------------------


def check_priority(value: object, where: str = "") -> int:
    """A priority: an integer of the smallint range (higher runs first)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(where, f"priority must be an integer, got {value!r}", "priority")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise _refuse(
            where, f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {value}",
            "priority",
        )
    return value


def check_max_attempts(value: object, where: str = "") -> int:
    """How many runs a job gets: 1 to 2^31-1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(where, f"max_attempts must be an integer, got {value!r}", "max_attempts")
    if not 1 <= value <= MAX_ATTEMPTS_MAX:
        raise _refuse(
            where, f"max_attempts must be between 1 and {MAX_ATTEMPTS_MAX}, got {value}",
            "max_attempts",
        )
    return value


def check_text(value: object, field: str, where: str = "") -> str:
    """A name as akadze stores it (akadze.names): non-empty, without NUL, at most
    KEY_MAX_BYTES in UTF-8."""
    wrong = names.problem(value, field)
    if wrong is not None:
        raise _refuse(where, wrong, field)
    assert isinstance(value, str)
    return value


def check_moment(value: object, field: str, where: str = "") -> datetime:
    if not isinstance(value, datetime):
        raise _refuse(where, f"{field} must be a datetime, got {type(value).__name__}", field)
    if value.tzinfo is None or value.utcoffset() is None:
        raise _refuse(
            where,
            f"{field} must be timezone-aware (a naive datetime is ambiguous), "
            "e.g. datetime.now(UTC) + timedelta(minutes=5)",
            field,
        )
    return value


def _duration(value: object, name: str, where: str) -> timedelta:
    """``value`` (a timedelta, or a finite number of seconds) as a timedelta; the
    option ``name`` is refused otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise _refuse(where, f"{name} must be a timedelta or a number of seconds, got "
                      f"{type(value).__name__}", name)
    if isinstance(value, timedelta):
        return value
    if not math.isfinite(value):
        raise _refuse(where, f"{name} must be finite, got {value}", name)
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise _refuse(where, f"{name} is too large", name) from None


def check_delay(value: object, now: datetime, where: str = "") -> timedelta:
    """A non-negative timedelta (or number of seconds) that keeps run_at representable."""
    value = _duration(value, "delay", where)
    if value < _NO_DELAY:
        raise _refuse(where, f"delay must not be negative, got {value}", "delay")
    try:
        now + value
    except OverflowError:
        raise _refuse(where, "delay is too large (run_at after year 9999)", "delay") from None
    return value


def _plain_json(value: Any, path: str, depth: int, where: str) -> Any:
    """``value`` as plain JSON data that jsonb stores and hands back unchanged."""
    if depth > META_MAX_DEPTH:
        raise _refuse(where, f"{path} is nested deeper than {META_MAX_DEPTH} levels", "meta")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if "\x00" in value:
            raise _refuse(where, f"{path} contains a NUL character", "meta")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(where, f"{path} is not valid Unicode", "meta") from None
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse(where, f"{path} is {value}; JSON has no NaN or Infinity", "meta")
        if abs(value) >= FLOAT_EXACT_LIMIT:
            raise _refuse(
                where,
                f"{path} is {value}: floats of 1e16 and above do not come back from "
                "PostgreSQL exactly; store an int or a string",
                "meta",
            )
        return float(value)
    if isinstance(value, Mapping):
        plain: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _refuse(
                    where, f"{path} has a {type(key).__name__} key {key!r}; keys must be strings",
                    "meta",
                )
            if "\x00" in key:
                raise _refuse(where, f"{path} has a key containing a NUL character", "meta")
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:
                raise _refuse(
                    where, f"{path} has a key that is not valid Unicode", "meta") from None
            plain[key] = _plain_json(item, f"{path}.{key}", depth + 1, where)
        return plain
    if isinstance(value, list):
        return [_plain_json(item, f"{path}[{n}]", depth + 1, where) for n, item in enumerate(value)]
    raise _refuse(
        where,
        f"{path} is a {type(value).__name__}, not JSON data "
        "(use dict, list, str, int, float, bool or None)",
        "meta",
    )


def check_meta(value: object, where: str = "") -> tuple[dict[str, Any], str]:
    """The meta object and its compact JSON text."""
    if not isinstance(value, Mapping):
        raise _refuse(where, f"meta must be a JSON object (a dict), got {type(value).__name__}",
                      "meta")
    plain = _plain_json(value, "meta", 0, where)
    text = json.dumps(plain, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    size = len(text.encode("utf-8"))
    if size > META_MAX_BYTES:
        raise _refuse(where, f"meta is {size} bytes as JSON; at most {META_MAX_BYTES}", "meta")
    return plain, text


ON_DUPLICATE = ("raise", "ignore", "replace")
AFTER_POLICIES = ("cancel", "run")


def check_choice(value: object, field: str, choices: tuple[str, ...], where: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise _refuse(where, f"{field} must be one of {listed}, got {value!r}", field)
    return value


def check_period(value: object, where: str = "") -> timedelta:
    """unique_for: a positive timedelta or number of seconds."""
    value = _duration(value, "unique_for", where)
    if value <= _NO_DELAY:
        raise _refuse(where, f"unique_for must be positive, got {value}", "unique_for")
    if value > timedelta(days=36_500):
        raise _refuse(where, "unique_for must be at most 100 years", "unique_for")
    return value


def check_after(value: object, where: str = "") -> tuple[int | Job, ...]:
    """after: the jobs a job waits for, as job ids or Job items of the same call."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise _refuse(where, "after must be a list of job ids (or akadze.Job items of the "
                      f"same enqueue_many), got {type(value).__name__}", "after")
    parents: list[int | Job] = []
    for item in value:
        if isinstance(item, Job):
            parents.append(item)
        elif isinstance(item, int) and not isinstance(item, bool) and 1 <= item < 2**63:
            parents.append(int(item))
        else:
            raise _refuse(where, "after must name jobs by their ids (positive integers) or "
                          f"as akadze.Job items of the same enqueue_many, got {item!r}",
                          "after")
    # once each: ids by value, Jobs by identity (an item of a graph is the object itself)
    seen: set[object] = set()
    unique = []
    for parent in parents:
        mark = parent if isinstance(parent, int) else ("job", id(parent))
        if mark not in seen:
            seen.add(mark)
            unique.append(parent)
    return tuple(unique)


def default_options(task: TaskSpec) -> Options:
    """The options of a job of ``task`` given none: the task's defaults."""
    return Options(
        queue=task.queue, priority=task.priority, max_attempts=task.max_attempts,
        run_at=None, delay=_NO_DELAY, limit_key=None, unique_key=None, expires_at=None,
        meta={}, meta_json="{}",
    )


def build_options(
    task: TaskSpec, given: Mapping[str, object], *, base: Options | None = None, where: str = ""
) -> Options:
    """Checked options from ``given`` (an EnqueueOptions, or a Job's options); those left
    out (or None) come from ``base``, else from the task."""
    delay, run_at, expires_at = given.get("delay"), given.get("run_at"), given.get("expires_at")
    priority, max_attempts = given.get("priority"), given.get("max_attempts")
    queue, limit_key, unique_key = given.get("queue"), given.get("limit_key"), given.get(
        "unique_key")
    meta = given.get("meta")
    unique_for, on_duplicate = given.get("unique_for"), given.get("on_duplicate")
    keep_run_at, after, after_policy = (given.get("keep_run_at"), given.get("after"),
                                        given.get("after_policy"))
    if delay is not None and run_at is not None:
        raise _refuse(where, "give delay or run_at, not both", "delay")
    if base is None:
        base = default_options(task)
    checked_priority = base.priority if priority is None else check_priority(priority, where)
    checked_attempts = (
        base.max_attempts if max_attempts is None else check_max_attempts(max_attempts, where)
    )
    if delay is None and run_at is None:
        checked_run_at, checked_delay = base.run_at, base.delay
    elif run_at is not None:
        checked_run_at, checked_delay = check_moment(run_at, "run_at", where), _NO_DELAY
    else:
        checked_run_at, checked_delay = None, check_delay(delay, task.app.clock.now(), where)
    if meta is None:
        meta_plain, meta_json = base.meta, base.meta_json
    else:
        meta_plain, meta_json = check_meta(meta, where)
    checked_key = (
        base.unique_key if unique_key is None else check_text(unique_key, "unique_key", where))
    checked_policy = (base.on_duplicate if on_duplicate is None
                      else check_choice(on_duplicate, "on_duplicate", ON_DUPLICATE, where))
    if keep_run_at is not None and not isinstance(keep_run_at, bool):
        raise _refuse(where, f"keep_run_at must be True or False, got {keep_run_at!r}",
                      "keep_run_at")
    checked_keep = base.keep_run_at if keep_run_at is None else keep_run_at
    checked_period = base.unique_for if unique_for is None else check_period(unique_for, where)
    if checked_key is None and (unique_for is not None or on_duplicate is not None
                                or keep_run_at):
        raise _refuse(where, "unique_for, on_duplicate and keep_run_at need a unique_key",
                      "unique_key")
    if checked_keep and checked_policy != "replace":
        raise _refuse(where, 'keep_run_at applies to on_duplicate="replace"', "keep_run_at")
    return Options(
        queue=base.queue if queue is None else check_text(queue, "queue", where),
        priority=checked_priority,
        max_attempts=checked_attempts,
        run_at=checked_run_at,
        delay=checked_delay,
        limit_key=(
            base.limit_key if limit_key is None else check_text(limit_key, "limit_key", where)
        ),
        unique_key=checked_key,
        expires_at=(
            base.expires_at if expires_at is None else check_moment(expires_at, "expires_at", where)
        ),
        meta=meta_plain,
        meta_json=meta_json,
        unique_for=checked_period,
        on_duplicate=checked_policy,
        keep_run_at=checked_keep,
        after=base.after if after is None else check_after(after, where),
        after_policy=(base.after_policy if after_policy is None
                      else check_choice(after_policy, "after_policy", AFTER_POLICIES, where)),
    )


# -- one job ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pending:
    """One checked job, ready to insert."""

    task: str
    args_json: str
    options: Options

    def enqueued(self, job_id: int, run_at: datetime) -> EnqueuedJob:
        options = self.options
        return EnqueuedJob(
            id=job_id, queue=options.queue, task=self.task, args=json.loads(self.args_json),
            priority=options.priority, run_at=run_at, max_attempts=options.max_attempts,
            limit_key=options.limit_key, unique_key=options.unique_key,
            expires_at=options.expires_at, meta=dict(options.meta),
        )


def build_pending(task: TaskSpec, options: Options, kwargs: Mapping[str, Any]) -> Pending:
    """One job, checked: its arguments (akadze.arguments) and options."""
    args_json = arguments.serialize_args(task, kwargs, max_bytes=task.app.max_args_bytes)
    return Pending(task=task.name, args_json=args_json, options=options)
