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
    "MigrationError",
    "ScheduleError",
    "Task",
    "UnknownTask",
    "__version__",
    "migrate",
    "migrate_sync",
]
