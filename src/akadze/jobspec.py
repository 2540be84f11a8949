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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict, Unpack

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
    """The options of one job of a bulk insert (:class:`Job`)."""

    delay: timedelta | float | None
    run_at: datetime | None
    expires_at: datetime | None


class EnqueueOptions(JobOptions, total=False):
    """The options of ``task.using(...)``: a job's options plus ``unique_key``, which bulk
    inserts do not take (one duplicate would abort the whole COPY)."""

    unique_key: str | None


def check_option_names(given: Mapping[str, object], allowed: type[Any], where: str) -> None:
    """Refuse option names ``allowed`` (one of the typed dicts above) does not list, as
    Python refuses an unknown keyword argument."""
    known: frozenset[str] = allowed.__required_keys__ | allowed.__optional_keys__
    unknown = sorted(set(given) - known)
    if unknown:
        hint = (" (unique_key is not available in bulk: enqueue such jobs one at a time)"
                if "unique_key" in unknown else "")
        raise TypeError(f"{where} got an unexpected keyword argument {unknown[0]!r}{hint}")


@dataclass(frozen=True, init=False)
class Job:
    """One item of ``enqueue_many`` with options of its own::

        Job({"name": "ada"}, limit_key="acme", priority=5)

    Options left out (``None``) take the enqueuer's, then the task's. ``delay`` or
    ``run_at`` given here replace both of the enqueuer's. ``unique_key`` is not
    available in bulk (one duplicate would abort the whole COPY).
    """

    args: Mapping[str, Any]
    options: JobOptions

    def __init__(self, args: Mapping[str, Any] | None = None,
                 **options: Unpack[JobOptions]) -> None:
        check_option_names(options, JobOptions, "Job()")
        object.__setattr__(self, "args", {} if args is None else args)
        object.__setattr__(self, "options", options)


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


def check_delay(value: object, now: datetime, where: str = "") -> timedelta:
    """A non-negative timedelta (or number of seconds) that keeps run_at representable."""
    if isinstance(value, bool) or not isinstance(value, int | float | timedelta):
        raise _refuse(
            where,
            f"delay must be a timedelta or a number of seconds, got {type(value).__name__}",
            "delay",
        )
    if not isinstance(value, timedelta):
        if not math.isfinite(value):
            raise _refuse(where, f"delay must be finite, got {value}", "delay")
        try:
            value = timedelta(seconds=value)
        except OverflowError:
            raise _refuse(where, "delay is too large", "delay") from None
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
    return Options(
        queue=base.queue if queue is None else check_text(queue, "queue", where),
        priority=checked_priority,
        max_attempts=checked_attempts,
        run_at=checked_run_at,
        delay=checked_delay,
        limit_key=(
            base.limit_key if limit_key is None else check_text(limit_key, "limit_key", where)
        ),
        unique_key=(
            base.unique_key if unique_key is None else check_text(unique_key, "unique_key", where)
        ),
        expires_at=(
            base.expires_at if expires_at is None else check_moment(expires_at, "expires_at", where)
        ),
        meta=meta_plain,
        meta_json=meta_json,
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


# -- many jobs ----------------------------------------------------------------------------

_BASE_COLUMNS = ("id", "queue", "task", "args", "priority", "max_attempts")

def copy_text(value: str) -> str:
    """``value`` escaped for COPY's text format."""
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


@dataclass(slots=True)
class Batch:
    """Checked jobs for one bulk insert.

    The arguments are validated when the batch is built; their JSON text is made
    chunk by chunk in :meth:`copy_chunks`, while the server ingests the previous
    chunk. What only serialization can find (a NUL character or a NaN inside an
    ``Any`` argument) raises EnqueueError from there, and the caller rolls back.
    """

    task: TaskSpec
    options: Options
    arg_dicts: list[Any]
    validated: list[Any]
    # Options of each item, or None when all items share ``options``.
    item_options: list[Options] | None
    columns: tuple[str, ...]
    # JSON text of each item's arguments, filled by copy_chunks.
    args: list[str] = field(default_factory=list)
    # The keys of the batch that have a limits row (enqueue's limited_keys query):
    # their jobs are copied with limited = true (migration 0005).
    limited_keys: frozenset[str] = frozenset()

    @property
    def size(self) -> int:
        return len(self.validated)

    def keys(self) -> list[str]:
        """The distinct limit keys of the batch."""
        if self.item_options is None:
            return [] if self.options.limit_key is None else [self.options.limit_key]
        return sorted({o.limit_key for o in self.item_options if o.limit_key is not None})

    def _options_of(self, index: int) -> Options:
        return self.options if self.item_options is None else self.item_options[index]

    def _row_parts(self, options: Options, now: datetime) -> tuple[str, str]:
        """The text of a row around its id and args: ``id{head}args{tail}``."""
        head = f"\t{copy_text(options.queue)}\t{copy_text(self.task.name)}\t"
        tail = [str(options.priority), str(options.max_attempts)]
        columns = self.columns
        if "run_at" in columns:
            tail.append(options.ready_at(now).isoformat())
        if "limit_key" in columns:
            tail.append(r"\N" if options.limit_key is None else copy_text(options.limit_key))
            tail.append("t" if options.limit_key in self.limited_keys else "f")
        if "meta" in columns:
            tail.append(copy_text(options.meta_json))
        if "expires_at" in columns:
            tail.append(r"\N" if options.expires_at is None else options.expires_at.isoformat())
        return head, "\t" + "\t".join(tail) + "\n"

    def _serialize(self, start: int, stop: int) -> list[str]:
        return arguments.dump_many(self.task, self.validated[start:stop], self.arg_dicts, start,
                                   max_bytes=self.task.app.max_args_bytes)

    def copy_chunks(self, ids: Sequence[int], now: datetime) -> Iterator[str]:
        """The COPY text-format data, in chunks of COPY_CHUNK_ROWS rows."""
        backslash, doubled = "\\", "\\\\"
        shared = self._row_parts(self.options, now)
        parts_by_options: dict[int, tuple[str, str]] = {id(self.options): shared}
        self.args = []
        for start in range(0, self.size, COPY_CHUNK_ROWS):
            stop = min(start + COPY_CHUNK_ROWS, self.size)
            texts = self._serialize(start, stop)
            self.args.extend(texts)
            args = [
                text.replace(backslash, doubled) if backslash in text else text
                for text in texts
            ]
            if self.item_options is None:
                head, tail = shared
                pairs = zip(ids[start:stop], args, strict=True)
                yield "".join([f"{i}{head}{a}{tail}" for i, a in pairs])
                continue
            rows = []
            chunk = zip(ids[start:stop], args, self.item_options[start:stop], strict=True)
            for i, a, options in chunk:
                parts = parts_by_options.get(id(options))
                if parts is None:
                    parts = parts_by_options[id(options)] = self._row_parts(options, now)
                rows.append(f"{i}{parts[0]}{a}{parts[1]}")
            yield "".join(rows)

    def enqueued(self, ids: Sequence[int], now: datetime) -> Iterator[EnqueuedJob]:
        """The inserted jobs (after copy_chunks has run)."""
        for index, (job_id, args) in enumerate(zip(ids, self.args, strict=True)):
            options = self._options_of(index)
            yield EnqueuedJob(
                id=job_id, queue=options.queue, task=self.task.name, args=json.loads(args),
                priority=options.priority, run_at=options.ready_at(now),
                max_attempts=options.max_attempts, limit_key=options.limit_key,
                expires_at=options.expires_at, meta=dict(options.meta),
            )


def _columns(all_options: Iterable[Options]) -> tuple[str, ...]:
    run_at = limit_key = meta = expires_at = False
    for options in all_options:
        run_at = run_at or options.scheduled
        limit_key = limit_key or options.limit_key is not None
        meta = meta or bool(options.meta)
        expires_at = expires_at or options.expires_at is not None
    extra = [
        name
        for name, used in (
            ("run_at", run_at), ("limit_key", limit_key), ("limited", limit_key),
            ("meta", meta), ("expires_at", expires_at),
        )
        if used
    ]
    return (*_BASE_COLUMNS, *extra)


def check_bulk(options: Options, items: object) -> None:
    """What enqueue_many refuses before looking at any item."""
    if options.unique_key is not None:
        raise EnqueueError(
            "unique_key cannot be used with enqueue_many (one duplicate would abort the "
            "whole batch); enqueue such jobs one at a time",
            field="unique_key",
        )
    if isinstance(items, Mapping | str | bytes):
        raise EnqueueError(
            "enqueue_many takes an iterable of items (mappings of arguments or akadze.Job), "
            f"got a single {type(items).__name__}",
            field="items",
        )


def build_batch(
    task: TaskSpec, options: Options, items: Iterable[Mapping[str, Any] | Job]
) -> Batch:
    """Check every item (arguments validated in one pydantic call). Raises EnqueueError
    naming the first bad item."""
    check_bulk(options, items)
    arg_dicts: list[Any] = []
    item_options: list[Options] | None = None
    for index, item in enumerate(items):
        if type(item) is dict:
            arg_dicts.append(item)
            if item_options is not None:
                item_options.append(options)
        elif isinstance(item, Job):
            if item_options is None:
                item_options = [options] * index
            item_options.append(
                build_options(task, item.options, base=options, where=f"item {index}: "))
            if not isinstance(item.args, Mapping):
                raise EnqueueError(
                    f"item {index}: Job.args must be a mapping of arguments, got "
                    f"{type(item.args).__name__}",
                    field="args",
                )
            arg_dicts.append(dict(item.args))
        elif isinstance(item, Mapping):
            arg_dicts.append(dict(item))
            if item_options is not None:
                item_options.append(options)
        else:
            raise EnqueueError(
                f"item {index}: expected a mapping of arguments or akadze.Job, got "
                f"{type(item).__name__}",
                field="items",
            )
    validated = arguments.validate_many(task, arg_dicts)
    columns = _columns([options] if item_options is None else [options, *item_options])
    return Batch(task, options, arg_dicts, validated, item_options, columns)
