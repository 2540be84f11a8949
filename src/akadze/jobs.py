"""What a job is, as code sees it: its states and the records akadze hands out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import ConfigurationError


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class ClaimedJob:
    """A job handed to a worker by a claim.

    ``run_count`` is the fencing token of this run: a finish is accepted only when
    the row still carries it.
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


def claimed_job(row: tuple[Any, ...]) -> ClaimedJob:
    """A ClaimedJob from a row of the job columns that the worker, rescue, cancel and
    requeue queries return, in this order: id, queue, task, args, priority, run_at,
    limit_key, run_count, attempt, max_attempts, meta, unique_key, expires_at,
    worker_id, started_at."""
    return ClaimedJob(
        id=row[0], queue=row[1], task=row[2], args=row[3], priority=row[4], run_at=row[5],
        limit_key=row[6], run_count=row[7], attempt=row[8], max_attempts=row[9],
        meta=row[10], unique_key=row[11], expires_at=row[12], worker_id=row[13],
        started_at=row[14],
    )


def check_job_id(job_id: object) -> int:
    """A job id given by a caller: a positive integer, else ConfigurationError."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise ConfigurationError(f"job_id must be a positive integer, got {job_id!r}")
    return job_id
