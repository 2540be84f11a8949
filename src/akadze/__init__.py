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
from .runs import RunContext, current
from .worker import Worker

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
