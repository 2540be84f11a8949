"""akadze: a PostgreSQL-backed job queue with exact cluster-wide limits and fair scheduling."""

from __future__ import annotations

from .app import Akadze
from .errors import (
    AkadzeError,
    ConfigurationError,
    DuplicateJob,
    EnqueueError,
    JobNotFound,
    LimitError,
    MigrationError,
    ScheduleError,
    UnknownTask,
)
from .jobs import ClaimedJob, JobState
from .limits import (
    LimitSummary,
    clear_limit,
    clear_limit_sync,
    list_limits,
    list_limits_sync,
    set_limit,
    set_limit_sync,
)
from .migrate import migrate, migrate_sync
from .tasks import Task

__version__ = "0.7.0.dev0"

__all__ = [
    "Akadze",
    "AkadzeError",
    "ClaimedJob",
    "ConfigurationError",
    "DuplicateJob",
    "EnqueueError",
    "JobNotFound",
    "JobState",
    "LimitError",
    "LimitSummary",
    "MigrationError",
    "ScheduleError",
    "Task",
    "UnknownTask",
    "__version__",
    "clear_limit",
    "clear_limit_sync",
    "list_limits",
    "list_limits_sync",
    "migrate",
    "migrate_sync",
    "set_limit",
    "set_limit_sync",
]

# The worker runtime.
from .cancellation import request_cancel, request_cancel_sync
from .errors import JobLost, WorkerError
from .outcomes import Cancel, Fail, Retry, Snooze, TaskOutcome
from .worker import RunContext, Worker, current

__all__ += [
    "Cancel",
    "Fail",
    "JobLost",
    "Retry",
    "RunContext",
    "Snooze",
    "TaskOutcome",
    "Worker",
    "WorkerError",
    "current",
    "request_cancel",
    "request_cancel_sync",
]

# Enqueue.
from .enqueue import Enqueuer  # noqa: E402
from .jobs import EnqueuedJob  # noqa: E402
from .jobspec import Job  # noqa: E402

__all__ += ["EnqueuedJob", "Enqueuer", "Job"]

# Periodic schedules and operations.
from .control import (  # noqa: E402
    pause_queue,
    pause_queue_sync,
    requeue,
    requeue_sync,
    resume_queue,
    resume_queue_sync,
    retry_now,
    retry_now_sync,
)
from .errors import InvalidJobState  # noqa: E402
from .overview import (  # noqa: E402
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
from .schedules import Schedule  # noqa: E402

__all__ += [
    "InvalidJobState",
    "JobSummary",
    "QueueSnapshot",
    "Schedule",
    "StateCount",
    "WorkerSummary",
    "get_job",
    "get_job_sync",
    "list_jobs",
    "list_jobs_sync",
    "list_workers",
    "list_workers_sync",
    "pause_queue",
    "pause_queue_sync",
    "queue_snapshot",
    "queue_snapshot_sync",
    "requeue",
    "requeue_sync",
    "resume_queue",
    "resume_queue_sync",
    "retry_now",
    "retry_now_sync",
]
