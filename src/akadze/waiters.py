"""The waiters of one process, shared per database: every ``wait_for`` (and
``wait_for_sync``) of this process on a database akadze opens by URL (the app, a URL)
is served by one connection, which LISTENs on ``akadze_done``, so that a thousand
concurrent waiters hold one connection, not a thousand.

That connection belongs to a thread of its own (a daemon, started by the first waiter,
gone a couple of seconds after the last): it marks the jobs its new waiters await in
one statement (``wait_mark_many``: the terminal write of a marked job notifies), reads
their states (``wait_states``), and then sleeps until a notification, a new waiter
or the next poll, the fallback for a lost notification or a server that cannot
notify (a pooler in transaction mode): every ``poll_interval`` seconds, the smallest
its waiters ask for, one statement reads the states of every job awaited. When a job
has ended, the thread reads its summary and hands it to each of its waiters: an
asyncio waiter through its loop (``call_soon_threadsafe``), a thread through an event.
A waiter's timeout is its own.

An error of the connection (the server gone, a schema missing) is handed to every
waiter then waiting, as their own connection's error would have been, after one
attempt to reconnect for waiters already served; the next waiter starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from . import database, dialog, queries
from .dialog import Dialog
from .errors import JobNotFound
from .overview import JobSummary, get_job_dialog

__all__ = ["APPLICATION_NAME", "LINGER", "Hub", "hub", "wait", "wait_sync"]

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
#: The application_name of the shared connection (pg_stat_activity).
APPLICATION_NAME = "akadze-waiters"
#: Seconds the connection stays open after its last waiter, for the next one.
LINGER = 2.0
# A mark that meets a deadlock (a worker's outcome batch locking the same rows in
# another order) is tried again, this many times.
_MARK_TRIES = 3

Outcome = JobSummary | BaseException


class Waiter:
    """One wait: its job, its poll interval, and how its outcome reaches it (called
    on the hub's thread, once)."""

    __slots__ = ("deliver", "gone", "job_id", "poll", "state")

    def __init__(self, job_id: int, poll: float, deliver: Callable[[Outcome], None]) -> None:
        self.job_id = job_id
        self.poll = poll
        self.deliver = deliver
        self.state: str | None = None  # the last state read, for a timeout's message
        self.gone = False  # removed (timed out, cancelled): not to be served


def _mark(ids: list[int]) -> Dialog[dict[int, str]]:
    yield from dialog.execute(queries.get("wait_mark_many"), {"ids": ids})
    return (yield from _states(ids))


def _states(ids: list[int]) -> Dialog[dict[int, str]]:
    rows = yield from dialog.rows(queries.get("wait_states"), {"ids": ids})
    return {int(job_id): str(state) for job_id, state in rows}


class Hub:
    """The shared waiters of one database (see the module's docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._new: list[Waiter] = []
        # the waiters of the round in progress: taken from _new, not yet in _waiting
        self._inflight: list[Waiter] = []
        self._waiting: dict[int, list[Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # -- the waiters' side (any thread) ---------------------------------------------------

    def add(self, waiter: Waiter) -> None:
        with self._lock:
            self._new.append(waiter)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="akadze-waiters")
                self._thread.start()
        self._poke()

    def remove(self, waiter: Waiter) -> None:
        with self._lock:
            waiter.gone = True
            if waiter in self._new:
                self._new.remove(waiter)
            found = self._waiting.get(waiter.job_id)
            if found is not None and waiter in found:
                found.remove(waiter)
                if not found:
                    del self._waiting[waiter.job_id]
            last = not self._new and not self._waiting
        if last:  # the thread may sleep till a poll far off: its linger starts now
            self._poke()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):  # full: the thread is being woken already
            self._wake_w.send(b"\0")

    # -- the hub's thread -------------------------------------------------------------------

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self._serve()
        except BaseException as exc:  # every waiter is told, then the thread ends
            self._fail_all(exc)
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = database.connect(self.url, autocommit=True, application_name=APPLICATION_NAME)
        try:
            dialog.run_sync(conn, dialog.execute(queries.get("wait_listen")))
        except BaseException:
            conn.close()
            raise
        return conn

    def _serve(self) -> psycopg.Connection[Any] | None:
        """Serve until nobody has waited for LINGER seconds; the connection to close."""
        conn: psycopg.Connection[Any] | None = None
        fd = -1  # the connection's socket, as registered
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        idle_since: float | None = None
        next_poll = math.inf
        try:
            while True:
                with self._lock:
                    fresh, self._new = self._new, []
                    self._inflight = fresh
                    if fresh or self._waiting:
                        idle_since = None
                    elif conn is None or (idle_since is not None
                                          and time.monotonic() - idle_since >= LINGER):
                        self._thread = None  # the next waiter starts a new thread
                        return conn
                    elif idle_since is None:
                        idle_since = time.monotonic()
                if conn is None:
                    conn = self._connect()
                    fd = conn.fileno()
                    selector.register(fd, selectors.EVENT_READ)
                try:
                    next_poll = self._round(conn, fresh, next_poll)
                except psycopg.OperationalError:
                    if not (conn.closed or conn.broken):
                        raise
                    # The connection is lost: notifications may have been missed. Reconnect
                    # once and read every job again (an error now reaches the waiters).
                    selector.unregister(fd)
                    conn.close()
                    conn = None
                    with self._lock:
                        fresh = fresh + [w for ws in self._waiting.values() for w in ws]
                        self._waiting = {}
                        self._inflight = fresh
                    if not fresh:
                        continue  # nobody waits: connect again only for the next waiter
                    conn = self._connect()
                    fd = conn.fileno()
                    selector.register(fd, selectors.EVENT_READ)
                    next_poll = self._round(conn, fresh, math.inf)
                with self._lock:
                    self._inflight = []
                timeout = next_poll - time.monotonic()
                if idle_since is not None or next_poll == math.inf:
                    timeout = LINGER
                for key, _ in selector.select(max(0.0, timeout)):
                    if key.fileobj is self._wake_r:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        finally:
            selector.close()

    def _round(self, conn: psycopg.Connection[Any], fresh: list[Waiter],
               next_poll: float) -> float:
        """Mark and read the jobs of ``fresh`` waiters, take the notifications in, and
        poll when it is due; return the time of the next poll."""
        if fresh:
            ids = sorted({w.job_id for w in fresh})
            states = self._marked(conn, ids)
            for waiter in fresh:
                state = states.get(waiter.job_id)
                if state is None:
                    waiter.deliver(JobNotFound(f"no job with id {waiter.job_id}"))
                    continue
                waiter.state = state
                with self._lock:
                    if not waiter.gone:
                        self._waiting.setdefault(waiter.job_id, []).append(waiter)
            self._settle(conn, {i: s for i, s in states.items() if s in TERMINAL})
        notified = {int(n.payload) for n in conn.notifies(timeout=0)
                    if n.payload.isdigit()}
        now = time.monotonic()
        with self._lock:
            watched = [i for i in notified if i in self._waiting]
            polls = [w.poll for ws in self._waiting.values() for w in ws]
            if now >= next_poll:
                watched = list(self._waiting)
        if watched:
            self._check(conn, sorted(watched))
        if not polls:
            return math.inf
        return min(next_poll, now + min(polls)) if now < next_poll else now + min(polls)

    def _marked(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, str]:
        for attempt in range(_MARK_TRIES):
            try:
                return dialog.run_sync(conn, _mark(ids))
            except psycopg.errors.DeadlockDetected:
                if attempt == _MARK_TRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _check(self, conn: psycopg.Connection[Any], ids: list[int]) -> None:
        states = dialog.run_sync(conn, _states(ids))
        for job_id in ids:
            if job_id not in states:
                self._end(job_id, JobNotFound(f"job {job_id} was deleted while awaited"))
        with self._lock:
            for job_id, state in states.items():
                for waiter in self._waiting.get(job_id, ()):
                    waiter.state = state
        self._settle(conn, {i: s for i, s in states.items() if s in TERMINAL})

    def _settle(self, conn: psycopg.Connection[Any], ended: dict[int, str]) -> None:
        for job_id in sorted(ended):
            outcome: Outcome
            try:
                outcome = dialog.run_sync(conn, get_job_dialog(job_id))
            except JobNotFound:
                outcome = JobNotFound(f"job {job_id} was deleted while awaited")
            self._end(job_id, outcome)

    def _end(self, job_id: int, outcome: Outcome) -> None:
        with self._lock:
            done = self._waiting.pop(job_id, [])
        for waiter in done:
            waiter.deliver(outcome)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            everyone = self._new + self._inflight + [
                w for ws in self._waiting.values() for w in ws]
            self._new, self._inflight, self._waiting = [], [], {}
            self._thread = None
        for waiter in everyone:
            waiter.deliver(exc)


_hubs: dict[str, Hub] = {}
_hubs_lock = threading.Lock()


def _forget_hubs() -> None:  # a forked child has none of its parent's threads
    global _hubs_lock
    _hubs.clear()
    _hubs_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_hubs)


def hub(url: str) -> Hub:
    """The shared waiters of the database at ``url`` in this process."""
    with _hubs_lock:
        found = _hubs.get(url)
        if found is None:
            found = _hubs[url] = Hub(url)
        return found


def _timed_out(waiter: Waiter, limit: float) -> TimeoutError:
    state = waiter.state or "not finished"
    return TimeoutError(f"job {waiter.job_id} is still {state} after {limit:g} s")


def _result(outcome: Outcome) -> JobSummary:
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


async def wait(url: str, job_id: int, timeout: float | None,  # noqa: ASYNC109 - wait_for's
               poll: float) -> JobSummary:
    """Wait on the shared connection of ``url`` for job ``job_id`` to end."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Outcome] = loop.create_future()

    def settle(outcome: Outcome) -> None:
        if not future.done():
            future.set_result(outcome)

    def deliver(outcome: Outcome) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, outcome)

    waiter = Waiter(job_id, poll, deliver)
    shared = hub(url)
    shared.add(waiter)
    try:
        async with asyncio.timeout(timeout):
            outcome = await future
    except TimeoutError:
        raise _timed_out(waiter, timeout or 0.0) from None
    finally:
        shared.remove(waiter)
    return _result(outcome)


def wait_sync(url: str, job_id: int, timeout: float | None, poll: float) -> JobSummary:
    """The sync twin of :func:`wait`: the calling thread blocks on an event."""
    arrived = threading.Event()
    box: list[Outcome] = []

    def deliver(outcome: Outcome) -> None:
        box.append(outcome)
        arrived.set()

    waiter = Waiter(job_id, poll, deliver)
    shared = hub(url)
    shared.add(waiter)
    try:
        if not arrived.wait(timeout):
            raise _timed_out(waiter, timeout or 0.0)
    finally:
        shared.remove(waiter)
    return _result(box[0])
