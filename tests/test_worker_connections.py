"""The connection budget of a worker process: how it is shared out, what is refused,
and what a busy worker really opens, counted in ``pg_stat_activity``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze import Akadze, Worker, current
from akadze.errors import ConfigurationError
from akadze.worker._connections import split_budget
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
    assert budget.general >= 2
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
    ({"connections": 4}, "connections must be at least 5 for this worker (claims 1, "
                         "outcomes and heartbeats 2, LISTEN 1, complete_tx of plain tasks 1)"),
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


async def test_a_busy_worker_stays_within_its_budget(database_url: str, conn: Conn) -> None:
    """Two queues of 20 slots, plain and async tasks all writing in complete_tx (the
    most a worker opens): the default budget is 3 + 40 / 10 = 7, and the peak seen in
    pg_stat_activity stays within it, also with the smallest this worker accepts (5)."""
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

    for budget, jobs in ((None, 150), (5, 60)):
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
