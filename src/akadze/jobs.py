"""What a job is, as code sees it: its states and the records akadze hands out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
