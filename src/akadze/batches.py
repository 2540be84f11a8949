"""A bulk insert, checked: the items of ``enqueue_many`` and their COPY rows. Pure code
(no I/O), built by :func:`build_batch` from the items and the enqueuer's options
(akadze.jobspec), and written by akadze.enqueue.

A batch may insert only some of its items (:attr:`Batch.rows`): an item whose
``unique_key`` is held by another job is answered with that job's id instead
(akadze.uniqueness decides which). Its items are jobs of one task (``task.using()
.enqueue_many``), or of several (``app.enqueue_many``, :func:`build_graph_batch`: each
item a :class:`Job` that names its task), in one COPY either way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import arguments, dependencies
from .dependencies import Start
from .errors import EnqueueError
from .jobs import EnqueuedJob
from .jobspec import Job, Options, TaskSpec, build_options, default_options

# Rows per chunk handed to COPY: the next chunk is formatted while the server
# ingests the previous one.
COPY_CHUNK_ROWS = 5_000

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
    # The item objects as given (a Job named in another item's ``after`` is found here).
    items: list[Mapping[str, Any] | Job] = field(default_factory=list)
    # JSON text of each inserted row's arguments, filled by copy_chunks.
    args: list[str] = field(default_factory=list)
    # The keys of the batch that have a limits row (enqueue's limited_keys query):
    # their jobs are copied with limited = true (migration 0005).
    limited_keys: frozenset[str] = frozenset()
    # The indexes of the items inserted, in order (None: every item).
    rows: list[int] | None = None
    # Options that replace an item's for its row (a replaced duplicate keeping its
    # run_at), by item index.
    row_options: dict[int, Options] = field(default_factory=dict)
    # The graph (akadze.dependencies), by item index: the items each item waits for,
    # and the ids of existing jobs it waits for.
    item_parents: dict[int, list[int]] = field(default_factory=dict)
    job_parents: dict[int, list[int]] = field(default_factory=dict)
    # How each inserted row starts (state, parents not done), by item index, and the
    # items that are parents of other rows (copied with dependents = true); set by
    # akadze.workflows before the COPY.
    starts: dict[int, Start] = field(default_factory=dict)
    parent_rows: frozenset[int] = frozenset()
    # (child item, parent, parent is an item, parent had ended) of the rows' edges:
    # the parent is an item index when it is an item, else an existing job's id.
    edges: list[tuple[int, int, bool, bool]] = field(default_factory=list)
    # The task of each item, or None when every item is a job of ``task``.
    item_tasks: list[TaskSpec] | None = None

    def task_of(self, index: int) -> TaskSpec:
        return self.task if self.item_tasks is None else self.item_tasks[index]

    @property
    def size(self) -> int:
        return len(self.validated)

    @property
    def inserted(self) -> list[int]:
        """The indexes of the items inserted."""
        return list(range(self.size)) if self.rows is None else self.rows

    def keys(self) -> list[str]:
        """The distinct limit keys of the batch."""
        if self.item_options is None:
            return [] if self.options.limit_key is None else [self.options.limit_key]
        return sorted({o.limit_key for o in self.item_options if o.limit_key is not None})

    def options_of(self, index: int) -> Options:
        found = self.row_options.get(index)
        if found is not None:
            return found
        return self.options if self.item_options is None else self.item_options[index]

    def unique_keys(self) -> list[str]:
        """The distinct unique keys of the batch, sorted (the order they are locked in)."""
        if self.item_options is None:
            return [] if self.options.unique_key is None else [self.options.unique_key]
        return sorted({o.unique_key for o in self.item_options if o.unique_key is not None})

    def _row_parts(self, options: Options, now: datetime, task: TaskSpec | None = None
                   ) -> tuple[str, str]:
        """The text of a row around its id and args: ``id{head}args{tail}``."""
        name = (task or self.task).name
        head = f"\t{copy_text(options.queue)}\t{copy_text(name)}\t"
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
        if "unique_key" in columns:
            tail.append(r"\N" if options.unique_key is None else copy_text(options.unique_key))
        return head, "\t" + "\t".join(tail) + "\n"

    def _graph_tail(self, index: int) -> str:
        """The state and dependents of a row (the last COPY columns)."""
        if "state" not in self.columns:
            return ""
        start = self.starts.get(index)
        state = "queued" if start is None else start.state
        return f"\t{state}\t{'t' if index in self.parent_rows else 'f'}"

    def serialize(self, indexes: Sequence[int]) -> list[str]:
        """The JSON text of the arguments of the items at ``indexes`` (the rows of a
        batch that inserts some of its items, the arguments of replaced duplicates)."""
        return [
            arguments.dump_many(self.task_of(i), [self.validated[i]], self.arg_dicts, i,
                                max_bytes=self.task.app.max_args_bytes)[0]
            for i in indexes
        ]

    def _texts(self, start: int, stop: int) -> list[str]:
        if self.rows is not None:
            return self.serialize(self.rows[start:stop])
        texts: list[str] = []
        for first, last in _runs(self.item_tasks, start, stop):  # one call per task's run
            texts.extend(arguments.dump_many(
                self.task_of(first), self.validated[first:last], self.arg_dicts, first,
                max_bytes=self.task.app.max_args_bytes))
        return texts

    def copy_chunks(self, ids: Sequence[int], now: datetime) -> Iterator[str]:
        """The COPY text-format data of the inserted rows (``ids`` theirs, in order), in
        chunks of COPY_CHUNK_ROWS rows."""
        backslash, doubled = "\\", "\\\\"
        shared = self._row_parts(self.options, now)
        parts_by_options: dict[tuple[int, str], tuple[str, str]] = {
            (id(self.options), self.task.name): shared}
        rows = self.inserted
        uniform = self.item_options is None and not self.row_options and (
            "state" not in self.columns) and self.item_tasks is None
        self.args = []
        for start in range(0, len(rows), COPY_CHUNK_ROWS):
            stop = min(start + COPY_CHUNK_ROWS, len(rows))
            texts = self._texts(start, stop)
            self.args.extend(texts)
            args = [
                text.replace(backslash, doubled) if backslash in text else text
                for text in texts
            ]
            if uniform:
                head, tail = shared
                pairs = zip(ids[start:stop], args, strict=True)
                yield "".join([f"{i}{head}{a}{tail}" for i, a in pairs])
                continue
            out = []
            chunk = zip(ids[start:stop], args, rows[start:stop], strict=True)
            for i, a, index in chunk:
                options = self.options_of(index)
                task = self.task_of(index)
                mark = (id(options), task.name)
                parts = parts_by_options.get(mark)
                if parts is None:
                    parts = parts_by_options[mark] = self._row_parts(options, now, task)
                if "state" in self.columns:
                    out.append(f"{i}{parts[0]}{a}{parts[1][:-1]}{self._graph_tail(index)}\n")
                else:
                    out.append(f"{i}{parts[0]}{a}{parts[1]}")
            yield "".join(out)

    def enqueued(self, ids: Sequence[int], now: datetime) -> Iterator[EnqueuedJob]:
        """The inserted jobs (after copy_chunks has run)."""
        for index, job_id, args in zip(self.inserted, ids, self.args, strict=True):
            options = self.options_of(index)
            yield EnqueuedJob(
                id=job_id, queue=options.queue, task=self.task_of(index).name,
                args=json.loads(args),
                priority=options.priority, run_at=options.ready_at(now),
                max_attempts=options.max_attempts, limit_key=options.limit_key,
                unique_key=options.unique_key, expires_at=options.expires_at,
                meta=dict(options.meta),
            )


def _runs(tasks: Sequence[TaskSpec] | None, start: int, stop: int) -> Iterator[tuple[int, int]]:
    """The runs [first, last) of items of one task within [start, stop)."""
    if tasks is None:
        if start < stop:
            yield start, stop
        return
    first = start
    for index in range(start + 1, stop + 1):
        if index == stop or tasks[index] is not tasks[first]:
            yield first, index
            first = index


def _columns(all_options: Iterable[Options]) -> tuple[str, ...]:
    run_at = limit_key = meta = expires_at = unique_key = False
    for options in all_options:
        run_at = run_at or options.scheduled
        limit_key = limit_key or options.limit_key is not None
        meta = meta or bool(options.meta)
        expires_at = expires_at or options.expires_at is not None
        unique_key = unique_key or options.unique_key is not None
    extra = [
        name
        for name, used in (
            ("run_at", run_at), ("limit_key", limit_key), ("limited", limit_key),
            ("meta", meta), ("expires_at", expires_at), ("unique_key", unique_key),
        )
        if used
    ]
    return (*_BASE_COLUMNS, *extra)


GRAPH_COLUMNS = ("state", "dependents")


def _graph(listed: list[Mapping[str, Any] | Job], item_options: list[Options] | None,
           options: Options) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The items each item waits for and the existing jobs it waits for. A Job named in
    ``after`` must be an item of the call, once; the graph of the items must be
    acyclic."""
    every = [options] * len(listed) if item_options is None else item_options
    if not any(o.after for o in every):
        return {}, {}
    position: dict[int, int] = {}
    twice: set[int] = set()
    for index, item in enumerate(listed):
        if isinstance(item, Job):
            if id(item) in position:
                twice.add(id(item))
            position.setdefault(id(item), index)
    items: dict[int, list[int]] = {}
    jobs: dict[int, list[int]] = {}
    for index, opts in enumerate(every):
        for parent in opts.after:
            if isinstance(parent, int):
                jobs.setdefault(index, []).append(parent)
                continue
            found = position.get(id(parent))
            if found is None or id(parent) in twice:
                why = "is not an item of this call" if found is None else (
                    "is an item of this call more than once")
                raise EnqueueError(f"item {index}: after names an akadze.Job that {why}",
                                   field="after")
            if found == index:
                raise EnqueueError(f"item {index}: a job cannot wait for itself",
                                   field="after")
            items.setdefault(index, []).append(found)
    cycle = dependencies.find_cycle(items)
    if cycle is not None:
        shown = " -> ".join(f"item {i}" for i in cycle)
        raise EnqueueError(f"after makes a cycle: {shown}", field="after")
    return items, jobs


def check_bulk(items: object) -> None:
    """What enqueue_many refuses before looking at any item."""
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
    check_bulk(items)
    listed = items if isinstance(items, list) else list(items)
    arg_dicts: list[Any] = []
    item_options: list[Options] | None = None
    for index, item in enumerate(listed):
        if type(item) is dict:
            arg_dicts.append(item)
            if item_options is not None:
                item_options.append(options)
        elif isinstance(item, Job):
            if item.task is not None and item.task is not task and item.task != task.name:
                named = item.task if isinstance(item.task, str) else item.task.name
                raise EnqueueError(
                    f"item {index}: is a job of task {named!r}, not {task.name!r}: jobs of "
                    "several tasks are enqueued together with app.enqueue_many(...)",
                    field="task",
                )
            if item_options is None:
                item_options = [options] * index
            item_options.append(
                build_options(task, item.options, base=options, where=f"item {index}: "))
            arg_dicts.append(_job_arguments(index, item))
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
    item_parents, job_parents = _graph(listed, item_options, options)
    validated = arguments.validate_many(task, arg_dicts)
    columns = _columns([options] if item_options is None else [options, *item_options])
    if item_parents or job_parents:
        columns = (*columns, *GRAPH_COLUMNS)
    return Batch(task, options, arg_dicts, validated, item_options, columns, items=listed,
                 item_parents=item_parents, job_parents=job_parents)


def _job_arguments(index: int, job: Job) -> dict[str, Any]:
    """The arguments of item ``index``, a Job, as a new dict; EnqueueError unless they
    are a mapping."""
    if not isinstance(job.args, Mapping):
        raise EnqueueError(
            f"item {index}: Job.args must be a mapping of arguments, got "
            f"{type(job.args).__name__}",
            field="args",
        )
    return dict(job.args)


def build_graph_batch(tasks: Sequence[TaskSpec], items: Sequence[Job]) -> Batch:
    """Check the items of ``app.enqueue_many``: each a :class:`Job` of its own task
    (``tasks[i]``, resolved by the caller), its options over that task's defaults.
    Raises EnqueueError naming the first bad item."""
    listed = list(items)
    arg_dicts: list[Any] = []
    item_options: list[Options] = []
    for index, (task, item) in enumerate(zip(tasks, listed, strict=True)):
        item_options.append(build_options(task, item.options, base=default_options(task),
                                          where=f"item {index}: "))
        arg_dicts.append(_job_arguments(index, item))
    first = default_options(tasks[0])
    item_parents, job_parents = _graph(list(listed), item_options, first)
    by_item = list(tasks)
    validated: list[Any] = []
    for start, stop in _runs(by_item, 0, len(listed)):  # one pydantic call per run
        validated.extend(arguments.validate_many(by_item[start], arg_dicts[start:stop], start))
    columns = _columns([first, *item_options])
    if item_parents or job_parents:
        columns = (*columns, *GRAPH_COLUMNS)
    return Batch(tasks[0], first, arg_dicts, validated, item_options, columns,
                 items=list(listed), item_parents=item_parents, job_parents=job_parents,
                 item_tasks=by_item)
