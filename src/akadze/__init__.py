"""akadze: a PostgreSQL-backed job queue with exact cluster-wide limits and fair scheduling.

The names below are the public surface; each is listed, with where it is documented,
in ``docs/reference/api.md`` (a test keeps the two lists equal).
"""

from __future__ import annotations

from .app import Akadze
from .awaiting import wait_for, wait_for_sync
from .backoff import BackoffPolicy
from .cancellation import request_cancel, request_cancel_sync
from .control import (
    pause_queue,
    pause_queue_sync,
    requeue,
    requeue_sync,
    resume_queue,
    resume_queue_sync,
    retry_now,
    retry_now_sync,
)
from .enqueue import Enqueuer
from .errors import (
    AkadzeError,
    AsyncHookError,
    ConfigurationError,
    DatabaseUnavailable,
    DuplicateJob,
    EmbeddedServerError,
    EnqueueError,
    FilterError,
    InvalidJobState,
    JobLost,
    JobNotFound,
    LimitError,
    MigrationError,
    ScheduleError,
    UnknownTask,
    UnstorableResult,
    WorkerError,
)
from .jobs import ClaimedJob, EnqueuedJob, JobState
from .jobspec import EnqueueOptions, Job, JobOptions
from .limits import (
    LimitSummary,
    clear_limit,
    clear_limit_sync,
    list_limits,
    list_limits_sync,
    set_limit,
    set_limit_sync,
)
from .migrate import applied_versions, migrate, migrate_sync
from .outcomes import Cancel, Fail, Retry, Snooze, TaskOutcome
from .overview import (
    JobSummary,
    QueueSnapshot,
    StateCount,
    WorkerSummary,
    get_job,
    get_job_sync,
    list_jobs,
    list_jobs_sync,
    list_workers,
    list_workers_sync,
    queue_snapshot,
    queue_snapshot_sync,
)
from .schedules import Schedule, ScheduleOptions
from .sessions import Session, SyncSession
from .tasks import Task
from .worker import RunContext, Worker, WorkerEvent, current

__version__ = "0.7.0.dev0"

__all__ = [
    "Akadze",
    "AkadzeError",
    "AsyncHookError",
    "BackoffPolicy",
    "Cancel",
    "ClaimedJob",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DuplicateJob",
    "EmbeddedServerError",
    "EnqueueError",
    "EnqueueOptions",
    "EnqueuedJob",
    "Enqueuer",
    "Fail",
    "FilterError",
    "InvalidJobState",
    "Job",
    "JobLost",
    "JobNotFound",
    "JobOptions",
    "JobState",
    "JobSummary",
    "LimitError",
    "LimitSummary",
    "MigrationError",
    "QueueSnapshot",
    "Retry",
    "RunContext",
    "Schedule",
    "ScheduleError",
    "ScheduleOptions",
    "Session",
    "Snooze",
    "StateCount",
    "SyncSession",
    "Task",
    "TaskOutcome",
    "UnknownTask",
    "UnstorableResult",
    "Worker",
    "WorkerError",
    "WorkerEvent",
    "WorkerSummary",
    "__version__",
    "applied_versions",
    "clear_limit",
    "clear_limit_sync",
    "current",
    "get_job",
    "get_job_sync",
    "list_jobs",
    "list_jobs_sync",
    "list_limits",
    "list_limits_sync",
    "list_workers",
    "list_workers_sync",
    "migrate",
    "migrate_sync",
    "pause_queue",
    "pause_queue_sync",
    "queue_snapshot",
    "queue_snapshot_sync",
    "request_cancel",
    "request_cancel_sync",
    "requeue",
    "requeue_sync",
    "resume_queue",
    "resume_queue_sync",
    "retry_now",
    "retry_now_sync",
    "set_limit",
    "set_limit_sync",
    "wait_for",
    "wait_for_sync",
]
