"""Jobs to be enqueued, checked: options, arguments, meta, and the COPY rows of a bulk
insert. Pure code (no I/O), shared by the sync and async enqueue paths.

Every check raises :class:`~akadze.errors.EnqueueError` naming the field, before any
statement is sent, so that a refused enqueue inserts nothing.
"""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pydantic
import pydantic_core

from .errors import EnqueueError
from .jobs import EnqueuedJob
from .tasks import _check_max_attempts, _check_priority

if TYPE_CHECKING:
    from .tasks import Task

# meta is a small label, GIN-indexed: its compact JSON form (UTF-8) is capped.
META_MAX_BYTES = 8 * 1024
META_MAX_DEPTH = 32
# queue, limit_key and unique_key sit in btree indexes, whose entries must stay well
# under PostgreSQL's ~2700-byte limit (queue and limit_key share one entry).
KEY_MAX_BYTES = 1000
# Python writes floats from 1e16 up in exponent form; jsonb keeps such a number as
# an integral numeric and hands it back as a (different) Python int. Below it, a
# float comes back exactly.
FLOAT_EXACT_LIMIT = 1e16
# Rows per chunk handed to COPY: the next chunk is formatted while the server
# ingests the previous one.
COPY_CHUNK_ROWS = 5_000

_NO_DELAY = timedelta(0)
# A NUL escape in JSON text: "\u0000" preceded by an even number of backslashes.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@dataclass(frozen=True)
class Job:
    """One item of ``enqueue_many`` with options of its own::

        Job({"name": "ada"}, limit_key="acme", priority=5)

    Options left out (``None``) take the enqueuer's, then the task's. ``delay`` or
    ``run_at`` given here replace both of the enqueuer's. ``unique_key`` is not
    available in bulk (one duplicate would abort the whole COPY).
    """

    args: Mapping[str, Any] = field(default_factory=dict)
    _: KW_ONLY
    delay: timedelta | float | None = None
    run_at: datetime | None = None
    priority: int | None = None
    max_attempts: int | None = None
    limit_key: str | None = None
    expires_at: datetime | None = None
    meta: Mapping[str, Any] | None = None
    queue: str | None = None


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


def _refuse(where: str, message: str, field: str | None) -> EnqueueError:
    return EnqueueError(f"{where}{message}", field=field)


# -- options ------------------------------------------------------------------------------


def check_text(value: object, field: str, where: str = "") -> str:
    """A non-empty string without NUL, at most KEY_MAX_BYTES in UTF-8."""
    if not isinstance(value, str):
        raise _refuse(where, f"{field} must be a string, got {type(value).__name__}", field)
    if not value:
        raise _refuse(where, f"{field} must not be empty", field)
    if "\x00" in value:
        raise _refuse(where, f"{field} must not contain a NUL character", field)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _refuse(where, f"{field} is not valid Unicode (a lone surrogate)", field) from None
    if size > KEY_MAX_BYTES:
        raise _refuse(where, f"{field} is {size} bytes long; at most {KEY_MAX_BYTES}", field)
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


def build_options(
    task: Task[Any],
    *,
    base: Options | None = None,
    where: str = "",
    delay: object = None,
    run_at: object = None,
    priority: object = None,
    max_attempts: object = None,
    unique_key: object = None,
    limit_key: object = None,
    expires_at: object = None,
    meta: object = None,
    queue: object = None,
) -> Options:
    """Checked options; left-out ones come from ``base``, else from the task."""
    if delay is not None and run_at is not None:
        raise _refuse(where, "give delay or run_at, not both", "delay")
    if base is None:
        base = Options(
            queue=task.queue, priority=task.priority, max_attempts=task.max_attempts,
            run_at=None, delay=_NO_DELAY, limit_key=None, unique_key=None, expires_at=None,
            meta={}, meta_json="{}",
        )
    try:
        checked_priority = base.priority if priority is None else _check_priority(priority)
        checked_attempts = (
            base.max_attempts if max_attempts is None else _check_max_attempts(max_attempts)
        )
    except EnqueueError as exc:
        raise _refuse(where, str(exc), exc.field) from None
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


# -- arguments ----------------------------------------------------------------------------


def json_problem(data: bytes) -> str | None:
    """What jsonb cannot store in this JSON text, if anything: NUL characters (PostgreSQL
    text cannot hold them) or NaN/Infinity (not JSON)."""
    if b"\\u0000" in data and _JSON_NUL.search(data):
        return "contain a NUL character (\\u0000), which PostgreSQL cannot store"
    if b"NaN" in data or b"Infinity" in data:
        try:
            json.loads(data, parse_constant=_no_constant)
        except ValueError:
            return "contain NaN or Infinity, which JSON cannot store"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _argument_with_problem(data: bytes) -> str | None:
    """The top-level argument that holds what json_problem found (for the message)."""
    try:
        loaded = json.loads(data, parse_constant=float)
    except ValueError:  # pragma: no cover - the text came from a JSON serializer
        return None
    for name, value in loaded.items():
        if json_problem(pydantic_core.to_json(name)) or json_problem(pydantic_core.to_json(value)):
            return str(name)
    return None


def _describe_errors(task: str, exc: pydantic.ValidationError, skip: int = 0) -> tuple[str, str]:
    """A message and the first offending field of a validation error; ``skip`` leading
    location parts (the item index of a list) are left out."""
    parts: list[str] = []
    errors = exc.errors()
    first_field = ""
    for error in errors[:5]:
        loc = ".".join(str(part) for part in error.get("loc", ())[skip:]) or "(arguments)"
        first_field = first_field or loc
        kind = error.get("type", "")
        if kind == "missing":
            parts.append(f"missing argument {loc!r}")
        elif kind == "extra_forbidden":
            parts.append(f"unexpected argument {loc!r}")
        elif kind in ("dict_type", "model_type", "typed_dict_type") and loc == "(arguments)":
            parts.append("arguments must be a mapping of names to values")
        else:
            parts.append(f"argument {loc!r}: {error.get('msg', 'invalid')}")
    more = len(errors) - 5
    suffix = f" (and {more} more)" if more > 0 else ""
    return f"task {task!r}: " + "; ".join(parts) + suffix, first_field


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


def serialize_args(task: Task[Any], kwargs: Mapping[str, Any], where: str = "") -> str:
    """Validate a job's arguments; return the JSON text to store. Raises EnqueueError."""
    # The list adapter of enqueue_many, for one item: the same checks on both paths.
    adapter = _list_adapter(task)
    try:
        validated = adapter.validate_python([kwargs])
    except pydantic.ValidationError as exc:
        message, first = _describe_errors(task.name, exc, skip=1)
        raise _refuse(where, message, first or None) from None
    try:
        data = pydantic_core.to_json(
            adapter.dump_python(validated, mode="json", exclude_unset=True)[0]
        )
    except (pydantic_core.PydanticSerializationError, ValueError) as exc:
        raise _refuse(where, f"task {task.name!r}: arguments are not storable as JSON: {exc}",
                      None) from None
    problem = json_problem(data)
    if problem:
        name = _argument_with_problem(data)
        shown = f"argument {name!r}" if name else "arguments"
        raise _refuse(where, f"task {task.name!r}: {shown} {problem}", name)
    return data.decode("utf-8")


def build_pending(task: Task[Any], options: Options, kwargs: Mapping[str, Any]) -> Pending:
    return Pending(task=task.name, args_json=serialize_args(task, kwargs), options=options)


# -- many jobs ----------------------------------------------------------------------------

_BASE_COLUMNS = ("id", "queue", "task", "args", "priority", "max_attempts")
_list_adapters: weakref.WeakKeyDictionary[Any, pydantic.TypeAdapter[Any]] = (
    weakref.WeakKeyDictionary()
)


def _list_adapter(task: Task[Any]) -> pydantic.TypeAdapter[Any]:
    adapter = _list_adapters.get(task)
    if adapter is None:
        adapter = pydantic.TypeAdapter(
            list[task.args_type],  # type: ignore[name-defined]
            # A non-finite float inside an ``Any`` argument is written as a bare NaN or
            # Infinity, which json_problem finds and refuses (pydantic's default writes
            # null, silently changing the value).
            config=pydantic.ConfigDict(ser_json_inf_nan="constants"),
        )
        _list_adapters[task] = adapter
    return adapter


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

    task: Task[Any]
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
        adapter = _list_adapter(self.task)
        try:
            plain = adapter.dump_python(
                self.validated[start:stop], mode="json", exclude_unset=True
            )
            data = [pydantic_core.to_json(item) for item in plain]
        except (pydantic_core.PydanticSerializationError, ValueError):
            self._name_the_item(start, stop)
            raise  # pragma: no cover - _name_the_item raises
        # One scan of the chunk; the per-item search runs only when something is found.
        if json_problem(b"\n".join(data)):
            for offset, item in enumerate(data):
                if json_problem(item):
                    self._name_the_item(start + offset, start + offset + 1)
        return [item.decode("utf-8") for item in data]

    def _name_the_item(self, start: int, stop: int) -> None:
        """Raise the EnqueueError of the first item in [start, stop) that cannot be stored."""
        for index in range(start, stop):
            serialize_args(self.task, self.arg_dicts[index], where=f"item {index}: ")

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


def _item_options(task: Task[Any], base: Options, job: Job, index: int) -> Options:
    return build_options(
        task, base=base, where=f"item {index}: ", delay=job.delay, run_at=job.run_at,
        priority=job.priority, max_attempts=job.max_attempts, limit_key=job.limit_key,
        expires_at=job.expires_at, meta=job.meta, queue=job.queue,
    )


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
    task: Task[Any], options: Options, items: Iterable[Mapping[str, Any] | Job]
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
            item_options.append(_item_options(task, options, item, index))
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
    validated = _validate_many(task, arg_dicts)
    columns = _columns([options] if item_options is None else [options, *item_options])
    return Batch(task, options, arg_dicts, validated, item_options, columns)


def _validate_many(task: Task[Any], arg_dicts: list[Any]) -> list[Any]:
    if not arg_dicts:
        return []
    try:
        return list(_list_adapter(task).validate_python(arg_dicts))
    except pydantic.ValidationError as exc:
        index = exc.errors()[0]["loc"][0]
        message, first = _describe_errors(task.name, exc, skip=1)
        raise EnqueueError(f"item {index}: {message}", field=first or None) from None
