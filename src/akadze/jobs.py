"""What a job is, as code sees it: its states, the records akadze hands out, and how
a job row is read into one (the psycopg row factories ``job_rows``, ``job_state_rows``)."""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from psycopg.rows import RowMaker, no_result

from .errors import ConfigurationError

if TYPE_CHECKING:
    # What psycopg's own row factories take: a sync or an async cursor.
    from psycopg._cursor_base import BaseCursor


class JobState(enum.StrEnum):
    WAITING = "waiting"
    QUEUED = "queued"
    #: Held by a worker for the slot of its key that frees next (a limited key at
    #: its max_running): it starts there when a run of the key ends.
    RESERVED = "reserved"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class ClaimedJob:
    """A job handed to a worker by a claim.

    ``claim_token`` is the fencing token of this run: a random value the claim wrote,
    which no crash or failover can hand out again; a finish is accepted only while
    the row still carries it. ``run_count`` counts the job's runs (a crash that undid a
    claim can give the next run the same count). A job claimed before migration 0007
    has no token (None) and is fenced by ``run_count``. ``unreadable`` says why the
    stored ``args`` or ``meta`` could not be read (a row written by other means, nested
    past Python's recursion limit): they are then empty, and the worker fails the job
    as ``InvalidArguments`` without running it.
    """

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    priority: int
    run_at: datetime
    limit_key: str | None
    run_count: int
    attempt: int
    max_attempts: int
    meta: dict[str, Any] = field(default_factory=dict)
    unique_key: str | None = None
    expires_at: datetime | None = None
    worker_id: str | None = None
    started_at: datetime | None = None
    claim_token: int | None = None
    # Not a column (reading the row sets it): keep it the last field, after the
    # columns, which the row factories pass by position.
    unreadable: str | None = None


@dataclass(frozen=True)
class EnqueuedJob:
    """A job as it was just inserted by an enqueue; what ``on_enqueue`` hooks receive.

    ``args`` and ``meta`` are the stored JSON forms; ``run_at`` is the time the job
    becomes ready (database time, including ``delay``).
    """

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    priority: int
    run_at: datetime
    max_attempts: int
    limit_key: str | None = None
    unique_key: str | None = None
    expires_at: datetime | None = None
    meta: dict[str, Any] = field(default_factory=dict)


# The columns a ClaimedJob is read from: its fields (but ``unreadable``, which
# reading makes), which are the columns of the job_columns fragment
# (sql/queries/jobs.sql) that every query returning a job splices in.
JOB_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ClaimedJob)
                                     if f.name != "unreadable")
_ARGS, _META = JOB_COLUMNS.index("args"), JOB_COLUMNS.index("meta")


def stored_json(value: Any) -> tuple[Any, str | None]:
    """A stored JSON value from the text a query sent for it (``column::text``):
    ``(the value, None)``, or ``(None, why)`` when Python cannot read it (nested past
    the recursion limit). SQL NULL is None; a value psycopg decoded already is taken
    as is."""
    if not isinstance(value, str):
        return value, None
    if value == "{}":  # most jobs' meta, and the args of tasks without arguments
        return {}, None
    try:
        return json.loads(value), None
    except RecursionError:
        return None, "nested too deeply to read (past Python's recursion limit)"
    except ValueError as exc:  # pragma: no cover - jsonb's output is JSON
        return None, f"not JSON ({exc})"


def stored_object(value: Any) -> tuple[dict[str, Any], str | None]:
    """A stored JSON object (``args``, ``meta``) from the text the job columns carry:
    ``(the object, None)``, or ``({}, why)`` when it cannot be read (nested past the
    recursion limit, not an object)."""
    loaded, why = stored_json(value)
    if why is not None:
        return {}, why
    if not isinstance(loaded, dict):
        return {}, f"a JSON {type(loaded).__name__}, not an object"
    return loaded, None


_new = object.__new__


def _job(values: Sequence[Any]) -> ClaimedJob:
    """A ClaimedJob from the job columns in JOB_COLUMNS order, args and meta decoded."""
    args, bad_args = stored_object(values[_ARGS])
    meta, bad_meta = stored_object(values[_META])
    if bad_args is None and bad_meta is None:
        # The fields written straight into the new instance: a claim reads
        # hundreds of rows per round trip, and the frozen dataclass's __init__
        # (one object.__setattr__ per field) cost 4.7 us a row against 1.7 us.
        # Every field is set, in the order of the fields (JOB_COLUMNS, then
        # unreadable), as __init__ would.
        made: ClaimedJob = _new(ClaimedJob)
        fields = made.__dict__
        fields.update(zip(JOB_COLUMNS, values, strict=True))
        fields["args"], fields["meta"], fields["unreadable"] = args, meta, None
        return made
    job = list(values)
    job[_ARGS], job[_META] = args, meta
    problems = [f"{name} {why}" for name, why in
                (("its stored arguments are", bad_args), ("its stored meta is", bad_meta))
                if why is not None]
    return replace(ClaimedJob(*job), unreadable="; ".join(problems))


def _picker(cursor: BaseCursor[Any, Any], columns: tuple[str, ...]
            ) -> Callable[[Sequence[Any]], tuple[Any, ...]] | None:
    """A function that picks ``columns``, by name, out of each row of the cursor's
    current result (None when it has none). The names are read from the result
    as it came (no ``description`` objects) and resolved once per shape."""
    result = cursor.pgresult
    if result is None or not result.nfields:
        return None
    return _pick(tuple(result.fname(i) or b"" for i in range(result.nfields)), columns)


@functools.lru_cache(maxsize=64)
def _pick(names: tuple[bytes, ...], columns: tuple[str, ...]
          ) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    found = {name.decode(): i for i, name in reversed(list(enumerate(names)))}
    missing = [name for name in columns if name not in found]
    if missing:
        raise RuntimeError(f"a job row lacks the columns {missing} (include job_columns)")
    return itemgetter(*(found[name] for name in columns))


def job_rows(cursor: BaseCursor[Any, Any]) -> RowMaker[ClaimedJob]:
    """psycopg row factory: each row as a :class:`ClaimedJob`, read by column name.

    The one mapper of the job row. A row costs one ``itemgetter`` call and the
    constructor (the claim reads its jobs through it)."""
    pick = _picker(cursor, JOB_COLUMNS)
    if pick is None:
        return no_result

    def job(values: Sequence[Any]) -> ClaimedJob:
        return _job(pick(values))

    return job


def job_state_rows(cursor: BaseCursor[Any, Any]) -> RowMaker[tuple[ClaimedJob, JobState]]:
    """psycopg row factory: each row as ``(ClaimedJob, its state)``, for the queries
    that add ``j.state`` to the job columns (operator actions, rescue)."""
    pick = _picker(cursor, (*JOB_COLUMNS, "state"))
    if pick is None:
        return no_result

    def job_and_state(values: Sequence[Any]) -> tuple[ClaimedJob, JobState]:
        *job, state = pick(values)
        return _job(job), JobState(state)

    return job_and_state


def check_job_id(job_id: object) -> int:
    """A job id given by a caller: a positive integer, else ConfigurationError."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise ConfigurationError(f"job_id must be a positive integer, got {job_id!r}")
    return job_id
