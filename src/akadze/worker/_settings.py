"""A worker's settings, checked once when the :class:`~akadze.Worker` is built."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..app import Akadze
from ..clock import Clock, SystemClock
from ..errors import ConfigurationError
from ._events import EventCallback

#: While listening, an idle claim loop whose look found nothing ready polls this many
#: times less often than ``poll_interval`` ...
QUIET_POLL_FACTOR = 10
#: ... but at least every this many seconds (the listener's probe period): see
#: :attr:`Settings.quiet_poll`.
QUIET_POLL_MAX = 30.0


@dataclass(frozen=True, slots=True)
class Settings:
    """What a worker was asked to do; the collaborators read it, nobody changes it."""

    app: Akadze
    queues: tuple[str, ...]
    task_names: tuple[str, ...]
    slots: int
    fair: bool
    lease: float
    shutdown_timeout: float
    poll_interval: float
    listen: bool
    worker_id: str
    clock: Clock | None
    url: str
    maintenance: bool
    #: The most server connections this worker process opens, all pools and the
    #: LISTEN connection together (split by :func:`~._connections.split_budget`).
    connections: int
    durable_claims: bool
    on_event: EventCallback | None
    #: The URL of the LISTEN connection (a direct one when ``url`` is a pooler's).
    listen_url: str | None = None
    #: ``url`` goes through a pooler in transaction mode: no server-side prepared
    #: statements, and LISTEN only on ``listen_url``.
    transaction_pooling: bool = False
    #: A run of a limited key that ends hands its slot to the key's next job
    #: (:mod:`._handoffs`).
    hand_off: bool = True

    @property
    def max_pending(self) -> int:
        """Outcomes waiting to be written beyond which claiming pauses."""
        return max(2 * self.slots * len(self.queues), 1_000)

    @property
    def quiet_poll(self) -> float | None:
        """The safety poll of a listening claim loop whose last look found nothing
        ready: QUIET_POLL_FACTOR x ``poll_interval``, at most QUIET_POLL_MAX, never
        below ``poll_interval`` (10 s by default). Listening, the loop otherwise
        waits for a notification or the next due time the look returned; this poll
        only catches what neither announces (a row changed by hand, outside akadze's
        statements). None: poll every ``poll_interval`` (not listening; or an
        injected clock, whose time need not pass with the event loop's)."""
        if not self.listen or self.sql_now() is not None:
            return None
        return max(self.poll_interval,
                   min(QUIET_POLL_FACTOR * self.poll_interval, QUIET_POLL_MAX))

    @property
    def any_plain_task(self) -> bool:
        """Whether a task runs in a thread (the worker then needs its thread pool)."""
        return any(not self.app.tasks[name].is_async for name in self.task_names)

    def sql_now(self) -> datetime | None:
        """The time to hand to SQL: the injected clock's, else None (the database's)."""
        if self.clock is None or isinstance(self.clock, SystemClock):
            return None
        return self.clock.now()

    def wall_now(self) -> datetime:
        """The time recorded in error entries: the injected clock's or the app's."""
        return (self.clock or self.app.clock).now()


def seconds(value: timedelta | float, name: str) -> float:
    amount = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
        raise ConfigurationError(f"{name} must be a non-negative number of seconds or timedelta")
    return float(amount)


def _task_names(app: Akadze, tasks: Collection[str] | None) -> tuple[str, ...]:
    if isinstance(tasks, str):
        raise ConfigurationError("tasks must be a collection of task names")
    names = sorted(app.tasks) if tasks is None else sorted(set(tasks))
    unknown = [name for name in names if name not in app.tasks]
    if unknown:
        known = ", ".join(map(repr, sorted(app.tasks))) or "none"
        raise ConfigurationError(
            f"Worker(tasks=...): the app has no task named {unknown[0]!r} "
            f"(registered: {known})"
        )
    if not names:
        raise ConfigurationError("the app has no tasks registered: nothing to run")
    return tuple(names)


def _queues(app: Akadze, names: Sequence[str], queues: Sequence[str] | None) -> tuple[str, ...]:
    if queues is None:
        queues = sorted({app.tasks[name].queue for name in names})
    if isinstance(queues, str):
        queues = [queues]
    unique = list(dict.fromkeys(queues))
    if not unique or not all(isinstance(q, str) and q for q in unique):
        raise ConfigurationError("queues must be a non-empty list of queue names")
    return tuple(unique)


def build_settings(
    app: Akadze,
    *,
    queues: Sequence[str] | None,
    slots: int,
    fair: bool,
    lease: timedelta | float,
    shutdown_timeout: timedelta | float,
    poll_interval: timedelta | float,
    listen: bool,
    worker_id: str | None,
    clock: Clock | None,
    database_url: str | None,
    tasks: Collection[str] | None,
    maintenance: bool,
    pool_size: int | None,
    durable_claims: bool,
    on_event: EventCallback | None,
    connections: int | None = None,
    listen_url: str | None = None,
    transaction_pooling: bool = False,
    hand_off: bool = True,
) -> Settings:
    """The settings of ``Worker(app, ...)``; ConfigurationError naming what is wrong."""
    if not isinstance(app, Akadze):
        raise ConfigurationError(f"Worker needs an Akadze app, got {type(app).__name__}")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ConfigurationError(f"slots must be a positive integer, got {slots!r}")
    names = _task_names(app, tasks)
    queue_names = _queues(app, names, queues)
    lease_seconds = seconds(lease, "lease")
    if lease_seconds < 0.1:
        raise ConfigurationError("lease must be at least 0.1 s")
    poll = seconds(poll_interval, "poll_interval")
    if poll <= 0:
        raise ConfigurationError("poll_interval must be positive")
    if on_event is not None and not callable(on_event):
        raise ConfigurationError("on_event must be a callable taking a WorkerEvent")
    if listen_url is not None and (not isinstance(listen_url, str) or not listen_url.strip()):
        raise ConfigurationError("listen_url must be a non-empty database URL or None")
    # Through a pooler in transaction mode, LISTEN works only on a direct connection:
    # without listen_url the worker polls.
    listening = bool(listen) and (not transaction_pooling or listen_url is not None)
    plain = any(not app.tasks[name].is_async for name in names)
    budget = _budget(connections, pool_size, slots * len(queue_names), listening, plain)
    return Settings(
        app=app,
        queues=queue_names,
        task_names=names,
        slots=slots,
        fair=bool(fair),
        lease=lease_seconds,
        shutdown_timeout=seconds(shutdown_timeout, "shutdown_timeout"),
        poll_interval=poll,
        listen=listening,
        worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        clock=clock,
        url=database_url or app.database_url,
        maintenance=maintenance,
        connections=budget,
        durable_claims=bool(durable_claims),
        on_event=on_event,
        listen_url=listen_url,
        transaction_pooling=bool(transaction_pooling),
        hand_off=bool(hand_off),
    )


def default_connections(total_slots: int) -> int:
    """The default budget of a worker process: 3, plus 1 per 10 slots (all queues)."""
    return 3 + total_slots // 10


def minimum_connections(listen: bool, plain: bool) -> int:
    """The fewest a worker can run on: claims 1; listening, LISTEN 1 and the general
    pool 1 (heartbeats borrow the LISTEN connection); not listening, the general pool
    2 (a heartbeat must not wait behind the other uses: with one, a worker was seen
    failing to renew its lease while it shut down); complete_tx of plain (thread)
    tasks 1 (when it has such tasks). 3, or 4 with plain tasks."""
    return 3 + int(plain)


def _budget(connections: int | None, pool_size: int | None, total_slots: int, listen: bool,
            plain: bool) -> int:
    for name, value in (("connections", connections), ("pool_size", pool_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
    if connections is not None and pool_size is not None:
        raise ConfigurationError("give connections or pool_size (the older name), not both")
    least = minimum_connections(listen, plain)
    if connections is None and pool_size is not None:
        # pool_size counted the general pool alone; claims and LISTEN came on top.
        connections = max(pool_size + 1 + int(listen), least)
    if connections is None:
        return max(default_connections(total_slots), least)
    if connections < least:
        needs = ["claims 1"]
        needs += (["outcomes 1", "LISTEN and heartbeats 1"] if listen
                  else ["outcomes and heartbeats 2"])
        needs += ["complete_tx of plain tasks 1"] * plain
        raise ConfigurationError(
            f"connections must be at least {least} for this worker ({', '.join(needs)}), "
            f"got {connections}")
    return connections
