"""Enqueue: insert jobs inside the caller's transaction (not built yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tasks import Task


class Enqueuer:
    def __init__(self, task: Task[Any], **options: Any) -> None:
        self.task = task
        self.options = options
