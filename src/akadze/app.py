"""The application object: where tasks, schedules, hooks and settings are registered."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from . import arguments, database, enqueue, schedules
from .backoff import BackoffPolicy
from .clock import SYSTEM_CLOCK, Clock
from .errors import AkadzeError, ConfigurationError, ScheduleError, UnknownTask
from .hooks import Hook
from .jobspec import Job
from .schedules import Schedule, ScheduleOptions
from .sessions import DatabaseSource, Session, SyncSession
from .tasks import Task, TaskFunction

if TYPE_CHECKING:  # SQLAlchemy is optional: imported when app.engine is first used
    from sqlalchemy.ext.asyncio import AsyncEngine

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_RETENTION = timedelta(days=7)


class Akadze(DatabaseSource):
    """An akadze application.

    Nothing touches the database at construction: the URL is checked for form
    only, and connections are opened when something needs one.

    ``database_url`` defaults to ``AKADZE_DATABASE_URL`` and, without it, to the
    embedded server (``akadze[embedded]``).

    ``max_args_bytes`` and ``max_result_bytes``: the most a job's arguments and its
    result may take as compact JSON (1 MiB each by default, at most 8 MiB). An enqueue
    over the first is refused with EnqueueError (``field="args"``).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        engine: AsyncEngine | None = None,
        retention: timedelta = DEFAULT_RETENTION,
        failed_retention: timedelta | None = None,
        clock: Clock | None = None,
        max_args_bytes: int = arguments.DEFAULT_PAYLOAD_BYTES,
        max_result_bytes: int = arguments.DEFAULT_PAYLOAD_BYTES,
    ) -> None:
        if database_url is not None:
            database.normalize_url(database_url)  # form check only, no connection
        if retention <= timedelta(0):
            raise ConfigurationError("retention must be a positive timedelta")
        if failed_retention is not None and failed_retention <= timedelta(0):
            raise ConfigurationError("failed_retention must be a positive timedelta")
        self._database_url = database_url
        self._engine = engine
        self.retention = retention
        # Failed jobs are kept for inspection; by default four times as long.
        self.failed_retention = failed_retention or retention * 4
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.max_args_bytes = arguments.check_payload_limit(max_args_bytes, "max_args_bytes")
        self.max_result_bytes = arguments.check_payload_limit(max_result_bytes,
                                                              "max_result_bytes")
        self.tasks: dict[str, Task[Any]] = {}
        self.schedules: dict[str, Schedule] = {}
        self.on_enqueue_hooks: list[Hook] = []
        self.before_run_hooks: list[Hook] = []
        self.after_run_hooks: list[Hook] = []
        self.on_transition_hooks: list[Hook] = []

    # -- database -----------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The resolved database URL (explicit, environment, or embedded)."""
        if self._database_url is None and self._engine is not None:
            return database.normalize_url(
                self._engine.url.render_as_string(hide_password=False)
            )
        return database.resolve_url(self._database_url)

    @property
    def engine(self) -> AsyncEngine:
        """A SQLAlchemy async engine on the app's database (needs ``akadze[sqlalchemy]``)."""
        if self._engine is None:
            try:
                from sqlalchemy.ext.asyncio import create_async_engine
            except ImportError:  # pragma: no cover - depends on the install
                raise ConfigurationError(
                    "app.engine needs SQLAlchemy: pip install 'akadze[sqlalchemy]'"
                ) from None
            self._engine = create_async_engine(database.sqlalchemy_url(self.database_url))
        return self._engine

    # -- tasks --------------------------------------------------------------------

    @overload
    def task(self, name: F, /) -> F: ...

    @overload
    def task(
        self,
        name: str | None = None,
        /,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        backoff: BackoffPolicy | None = None,
    ) -> Callable[[TaskFunction], Task[Any]]: ...

    def task(
        self,
        name: str | Callable[..., Any] | None = None,
        /,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        backoff: BackoffPolicy | None = None,
    ) -> Any:
        """Register a task: ``@app.task("send_email", queue="mail")``.

        The decorated function is returned as a :class:`Task`, which is still
        callable like the function itself.
        """
        if callable(name):
            raise ConfigurationError(
                "@app.task needs an explicit name, e.g. @app.task(\"send_email\"): "
                "the name is what queued jobs refer to, so moving code cannot break them"
            )

        def decorate(fn: TaskFunction) -> Task[Any]:
            return self.register(
                fn,
                name=name if name is not None else "",
                queue=queue,
                max_attempts=max_attempts,
                timeout=timeout,
                priority=priority,
                backoff=backoff,
            )

        return decorate

    def register(
        self,
        fn: TaskFunction,
        *,
        name: str,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        backoff: BackoffPolicy | None = None,
    ) -> Task[Any]:
        """Bind a plain callable as a task (for dependency injection)."""
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError("a task needs a non-empty name")
        if name in self.tasks:
            raise ConfigurationError(f"a task named {name!r} is already registered")
        task: Task[Any] = Task(
            self,
            fn,
            name=name,
            queue=queue,
            max_attempts=max_attempts,
            timeout=timeout,
            priority=priority,
            backoff=backoff,
        )
        self.tasks[name] = task
        return task

    def include(self, module: str) -> None:
        """Import ``module`` and call its ``register(app)``."""
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import {module!r}: {exc}") from None
        register = getattr(imported, "register", None)
        if not callable(register):
            raise ConfigurationError(f"module {module!r} has no register(app) function")
        register(self)

    def get_task(self, name: str) -> Task[Any]:
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} is registered", field="task") from None

    # -- graphs of several tasks --------------------------------------------------

    async def enqueue_many(self, items: Iterable[Job], /, *,
                           session: Session = None) -> list[int]:
        """Insert jobs of several tasks in one call: each item a :class:`Job` made by
        ``task.job(args, **options)`` (or ``Job(args, task=...)``), whose ``after`` may
        name other items of the call, of any task, so that a whole fan-out/fan-in graph
        is one COPY in one transaction. ``session`` as for ``task.using(session=...)``
        (None: the app's database, committed before the call returns). Returns the ids
        in item order; a bad item, an unknown parent id or a cycle raises EnqueueError
        and nothing is inserted."""
        return await enqueue.enqueue_graph(self, items, session=session)

    def enqueue_many_sync(self, items: Iterable[Job], /, *,
                          session: SyncSession = None) -> list[int]:
        """The sync twin of :meth:`enqueue_many`."""
        return enqueue.enqueue_graph_sync(self, items, session=session)

    # -- periodic schedules -------------------------------------------------------

    def periodic(
        self,
        name: str,
        /,
        *,
        cron: str | None = None,
        every: timedelta | float | str | None = None,
        timezone: str | None = None,
        overlap: bool = True,
        grace: timedelta | float | str | None = None,
        args: dict[str, Any] | None = None,
        limit_key: str | None = None,
        meta: dict[str, Any] | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: float | timedelta | None = None,
        priority: int = 0,
        backoff: BackoffPolicy | None = None,
    ) -> Callable[[TaskFunction], Task[Any]]:
        """Register a task named ``name`` and a schedule of the same name that runs it:
        ``@app.periodic("nightly", cron="0 3 * * *", timezone="Europe/Berlin")`` or
        ``every=timedelta(minutes=15)``. See :mod:`akadze.schedules`. Raises
        ScheduleError (and registers nothing) on a bad schedule."""
        if callable(name):
            raise ScheduleError("@app.periodic needs a name, e.g. @app.periodic(\"nightly\", "
                                "cron=\"0 3 * * *\")")
        when: schedules.WhenOptions = {
            "cron": cron, "every": every, "timezone": timezone, "overlap": overlap,
            "grace": grace, "args": args, "limit_key": limit_key, "meta": meta,
        }

        def decorate(fn: TaskFunction) -> Task[Any]:
            if isinstance(name, str) and name in self.tasks:
                raise schedules.refuse(name, "a task of that name is already registered")
            try:
                task: Task[Any] = Task(self, fn, name=name, queue=queue,
                                       max_attempts=max_attempts, timeout=timeout,
                                       priority=priority, backoff=backoff)
            except AkadzeError as exc:
                raise schedules.refuse(name, str(exc)) from None
            schedule = schedules.build(name, when, tasks=self.tasks, taken=self.schedules,
                                       task=task)
            self.tasks[name] = task
            self.schedules[name] = schedule
            return task

        return decorate

    def add_schedule(self, name: str, /, **options: Unpack[ScheduleOptions]) -> Schedule:
        """Schedule a registered task: ``app.add_schedule("report", task="send_report",
        cron="0 9 * * 1")``; options as for :meth:`periodic` plus ``queue``,
        ``priority`` and ``max_attempts`` of the jobs. Returns the Schedule."""
        schedule = schedules.from_options(name, options, tasks=self.tasks, taken=self.schedules)
        self.schedules[name] = schedule
        return schedule

    def add_schedules(self, items: Iterable[Mapping[str, Any]]) -> list[Schedule]:
        """Register schedules from configuration: a list of mappings with ``name``,
        ``task`` and the options of :meth:`add_schedule`. All or nothing."""
        built = schedules.from_entries(items, tasks=self.tasks, taken=self.schedules)
        for schedule in built:
            self.schedules[schedule.name] = schedule
        return built

    # -- hooks --------------------------------------------------------------------

    def on_enqueue(self, fn: F) -> F:
        """``fn(conn, job)`` runs in the enqueue transaction for every new job."""
        self.on_enqueue_hooks.append(fn)
        return fn

    def before_run(self, fn: F) -> F:
        """``fn(job)`` runs in the worker before each task run."""
        self.before_run_hooks.append(fn)
        return fn

    def after_run(self, fn: F) -> F:
        """``fn(job)`` runs in the worker after each task run, whatever its outcome."""
        self.after_run_hooks.append(fn)
        return fn

    def on_transition(self, fn: F) -> F:
        """``fn(conn, job, from_state, to_state)`` runs in the transaction of each change."""
        self.on_transition_hooks.append(fn)
        return fn

    def __repr__(self) -> str:
        shown = database.describe(self._database_url) if self._database_url else "default"
        return f"<Akadze database={shown} tasks={len(self.tasks)}>"


def transition_hooks(session: object, app: Akadze | None) -> list[Hook]:
    """The on_transition hooks for an operator's call (requeue, cancel): those of ``app``,
    or of ``session`` when the session is the app itself; none otherwise."""
    if app is None and isinstance(session, Akadze):
        app = session
    return list(app.on_transition_hooks) if app is not None else []
