"""The connection budget of a worker process: how it is shared out, what is refused,
and what a busy worker really opens, counted in ``pg_stat_activity``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import psycopg_pool
import pytest
from hypothesis import given
from hypothesis import strategies as st
from worker_support import Events, eventually, wait_event

from akadze import Akadze, Worker, current
from akadze.errors import ConfigurationError
from akadze.worker._connections import CHECK_AFTER_IDLE, IdleCheck, split_budget
from akadze.worker._settings import default_connections, minimum_connections

Conn = psycopg.Connection[Any]


@given(queues=st.integers(1, 50), listen=st.booleans(), plain=st.booleans(),
       extra=st.integers(0, 200))
def test_the_budget_is_shared_out_exactly(queues: int, listen: bool, plain: bool,
                                          extra: int) -> None:
    connections = minimum_connections(listen, plain) + extra
    budget = split_budget(connections, queues, listen, plain)
    assert budget.total == connections
    assert budget.listen == int(listen)
    assert 1 <= budget.claims <= queues
    # Listening, heartbeats borrow the LISTEN connection; else they need a second one.
    assert budget.general >= (1 if listen else 2)
    assert (budget.sync >= 1) == plain


def test_the_default_is_three_plus_one_per_ten_slots() -> None:
    assert [default_connections(s) for s in (1, 9, 10, 20, 40, 100)] == [3, 3, 4, 5, 7, 13]


def _app(database_url: str, *, plain: bool) -> Akadze:
    app = Akadze(database_url=database_url)

    if plain:
        @app.task("t", queue="a")
        def t() -> None:
            return None
    else:
        @app.task("t", queue="a")
        async def t_async() -> None:
            return None
    return app


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"connections": 3}, "connections must be at least 4 for this worker (claims 1, "
                         "outcomes 1, LISTEN and heartbeats 1, complete_tx of plain tasks 1)"),
    ({"connections": 0}, "connections must be a positive integer"),
    ({"connections": 5, "pool_size": 3}, "give connections or pool_size"),
])
def test_a_budget_too_small_is_refused(database_url: str, kwargs: dict[str, Any],
                                       message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Worker(_app(database_url, plain=True), **kwargs)
    assert message in str(info.value)


def test_without_listen_or_plain_tasks_three_are_enough(database_url: str) -> None:
    worker = Worker(_app(database_url, plain=False), listen=False, connections=3)
    assert worker.listen is False
    with pytest.raises(ConfigurationError, match="outcomes and heartbeats 2"):
        Worker(_app(database_url, plain=False), listen=False, connections=2)


async def test_a_busy_worker_stays_within_its_budget(database_url: str, conn: Conn) -> None:
    """Two queues of 20 slots, plain and async tasks all writing in complete_tx (the
    most a worker opens): the default budget is 3 + 40 / 10 = 7, and the peak seen in
    pg_stat_activity stays within it, also with the smallest this worker accepts (4)."""
    app = Akadze(database_url=database_url)

    @app.task("pt", queue="a")
    def pt() -> None:
        time.sleep(0.01)
        with current().complete_tx() as tx:
            tx.execute("SELECT pg_sleep(0.005)")

    @app.task("at", queue="b")
    async def at() -> None:
        await asyncio.sleep(0.01)
        async with current().complete_tx() as tx:
            await tx.execute("SELECT pg_sleep(0.005)")

    for budget, jobs in ((None, 150), (4, 60)):
        conn.execute("DELETE FROM akadze.jobs")
        with psycopg.connect(database_url) as enqueuing:
            pt.using(session=enqueuing).enqueue_many_sync([{}] * jobs)
            at.using(session=enqueuing).enqueue_many_sync([{}] * jobs)
        peak = _Peak(database_url)
        with peak:
            async with Worker(app, slots=20, connections=budget, poll_interval=0.05):
                deadline = time.monotonic() + 60
                while conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = "
                                   "'succeeded'").fetchone() != (2 * jobs,):
                    assert time.monotonic() < deadline, "the jobs did not all run"
                    await asyncio.sleep(0.05)  # polling database state with a deadline
        limit = 7 if budget is None else budget
        assert 3 <= peak.most <= limit, (budget, peak.most)


async def test_a_small_listening_worker_runs_on_three(database_url: str, conn: Conn) -> None:
    """A listening worker of 2 slots with async tasks opens 3 connections (LISTEN,
    claims, the general pool of 1). While a job's complete_tx holds the whole general
    pool, the lease is still renewed (heartbeats borrow the LISTEN connection) and a
    job enqueued meanwhile is still noticed and started (polls are 60 s apart)."""
    app = Akadze(database_url=database_url)
    holding = asyncio.Event()
    release = asyncio.Event()
    second_started = asyncio.Event()

    @app.task("hold")
    async def hold() -> None:
        async with current().complete_tx() as tx:
            await tx.execute("SELECT 1")
            holding.set()
            await release.wait()

    @app.task("second")
    async def second() -> None:
        second_started.set()

    events = Events()
    with psycopg.connect(database_url) as enqueuing:
        hold.using(session=enqueuing).enqueue_sync()
    peak = _Peak(database_url)
    with peak:
        async with Worker(app, slots=2, lease=1.0, poll_interval=60,
                          on_event=events) as worker:
            assert worker.listen
            await wait_event(holding)
            renewed = len(events.seen)
            await events.next("lease_renewed", after=renewed)
            again = await events.next("lease_renewed", after=renewed)
            await events.next("lease_renewed", after=again)
            with psycopg.connect(database_url) as enqueuing:
                second.using(session=enqueuing).enqueue_sync()
            await wait_event(second_started)
            assert events.find("fenced") is None
            release.set()
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = "
                               "'succeeded'").fetchone() != (2,):
                assert time.monotonic() < deadline, "the jobs did not both finish"
                await asyncio.sleep(0.02)  # polling database state with a deadline
    assert peak.most == 3, peak.most


class _Peak:
    """The most worker connections of the database seen at once, sampled from another
    thread (a connection of its own, not counted) until the ``with`` ends."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.most = 0

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name LIKE 'akadze-worker%'").fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)
                self._stop.wait(0.003)


async def test_a_connection_is_checked_only_after_resting(database_url: str,
                                                          conn: Conn) -> None:
    """The general pool lends a connection that came back less than
    CHECK_AFTER_IDLE seconds ago without a round trip, and checks an older one:
    the server ends the session of a connection resting in the pool; lent at
    once, it is the same connection, unchecked (a check would have replaced it);
    returned again and lent after resting, the check finds it closed and the
    pool lends a new one."""
    now = [0.0]
    idle = IdleCheck(lambda: now[0])
    async with psycopg_pool.AsyncConnectionPool(
            database_url, min_size=1, max_size=1, timeout=10, check=idle.check,
            reset=idle.returned, kwargs={"autocommit": True}) as pool:
        async def back() -> None:  # the pool takes a connection back in a task of its own
            await eventually(lambda: pool.get_stats()["pool_available"] == 1,
                             what="the connection back in the pool")

        async with pool.connection() as lent:
            pid = lent.info.backend_pid
        await back()
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await eventually(lambda: conn.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s)",
            (pid,)).fetchone() == (True,), what="the session ended")
        now[0] += CHECK_AFTER_IDLE / 2
        async with pool.connection() as lent:
            assert lent.info.backend_pid == pid
            assert not lent.broken
        await back()
        now[0] += CHECK_AFTER_IDLE
        async with pool.connection() as lent:
            assert lent.info.backend_pid != pid
            await lent.execute("SELECT 1")
