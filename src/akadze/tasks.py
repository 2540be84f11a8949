"""Tasks: named functions whose keyword arguments are validated by a pydantic model
built from the function's signature (akadze.arguments).

``task.using(session=..., **options)`` checks the options once (akadze.jobspec) and
returns an :class:`~akadze.enqueue.Enqueuer` holding them: one trip down, tasks ->
jobspec -> enqueue.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Generic, TypeVar, Unpack

from . import arguments
from .backoff import BackoffPolicy
from .enqueue import EnqueueApp, Enqueuer
from .errors import ConfigurationError, EnqueueError
from .jobspec import (
    EnqueueOptions,
    Job,
    JobOptions,
    build_options,
    check_max_attempts,
    check_option_names,
    check_priority,
)
from .sessions import Session, SyncSession

R = TypeVar("R")
TaskFunction = Callable[..., Any]


class Task(Generic[R]):
    """A registered task. Calling it runs the function directly (handy in tests);
    ``task.using(session=...).enqueue(**kwargs)`` queues a job."""

    def __init__(
        self,
        app: EnqueueApp,
        fn: TaskFunction,
        *,
        name: str,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        backoff: BackoffPolicy | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"task {name!r}: {fn!r} is not callable")
        if not isinstance(queue, str) or not queue:
            raise ConfigurationError(f"task {name!r}: queue must be a non-empty string")
        try:
            check_max_attempts(max_attempts)
            check_priority(priority)
        except EnqueueError as exc:
            raise ConfigurationError(f"task {name!r}: {exc}") from None
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"task {name!r}: timeout must be positive")
        if backoff is not None and not callable(backoff):
            raise ConfigurationError(f"task {name!r}: backoff must be callable")
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.timeout: float | None = timeout
        self.priority = priority
        self.backoff = backoff
        self.is_async = inspect.iscoroutinefunction(fn)
        self.args_model = arguments.args_model(fn, name)
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def using(
        self, *, session: Session | SyncSession = None, **options: Unpack[EnqueueOptions]
    ) -> Enqueuer:
        """Options for the next enqueue (see :class:`akadze.jobspec.EnqueueOptions` and
        :class:`akadze.enqueue.Enqueuer`); options left out take the task's defaults.
        Raises EnqueueError for a bad option."""
        check_option_names(options, EnqueueOptions, "using()")
        return Enqueuer(self, session=session, options=build_options(self, options))

    def job(self, args: Mapping[str, Any] | None = None, /,
            **options: Unpack[JobOptions]) -> Job:
        """An item of ``app.enqueue_many`` (or of this task's ``enqueue_many``): a job of
        this task with ``args`` and options of its own; ``after`` may name other items
        of the same call, of any task. Same as ``Job(args, task=self, **options)``."""
        return Job(args, task=self, **options)

    @functools.cached_property
    def args_type(self) -> Any:
        """What enqueue validates arguments into: a TypedDict twin of ``args_model``
        (plain dicts of the given arguments), or the model itself."""
        return arguments.args_dict_type(self.args_model) or self.args_model

    def validate_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Check arguments as enqueue does; return their stored JSON form. Raises
        EnqueueError."""
        loaded: dict[str, Any] = json.loads(
            arguments.serialize_args(self, kwargs, max_bytes=self.app.max_args_bytes))
        return loaded

    def load_args(self, stored: dict[str, Any]) -> dict[str, Any]:
        """Validate stored JSON arguments before a run; return the call's keyword arguments."""
        model = self.args_model.model_validate(stored)
        return {name: getattr(model, name) for name in type(model).model_fields}

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"
