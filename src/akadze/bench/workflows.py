"""The workflow figures of ``akadze bench throughput``: the no-op throughput with and
without one ``wait_for`` waiter per 100 jobs (runs alternated, medians compared), and a
fan-out/fan-in run (``--fan-out`` children and one fan-in enqueued in one
``enqueue_many``) timed to the fan-in's start.

The waiters run in a process of their own (spawned, one asyncio loop: real ``wait_for``
calls, which share one connection of that process, akadze.waiters), so that they cost
the worker's process nothing but what they cost the database: the worker pays only for
the notifications of the jobs they await, in its outcome writes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from typing import Any

import click

from ..app import Akadze
from ..awaiting import wait_for
from ..database import connect
from ..worker import Worker

WAITER_EVERY = 100
TASK = "bench.noop"


class _Noop:
    """An app with one no-op task that counts its runs up to ``target``."""

    def __init__(self, url: str, target: int) -> None:
        self.app = Akadze(url)
        self.target = target
        self.done = 0
        self.finished = asyncio.Event()

        @self.app.task(TASK)
        async def noop() -> None:
            self.done += 1
            if self.done == self.target:
                self.finished.set()


def _reset(conn: Any) -> None:
    conn.execute("TRUNCATE akadze.jobs, akadze.workers, akadze.job_dependencies")


@dataclass
class WaiterRuns:
    jobs: int
    without: list[float]  # jobs/s of each run with nobody waiting
    with_waiters: list[float]  # jobs/s of each run with one waiter per WAITER_EVERY jobs

    @property
    def cost(self) -> float:
        """The median throughput lost to the waiters, as a share (0.03: 3 %)."""
        base = statistics.median(self.without)
        return 1.0 - statistics.median(self.with_waiters) / base if base else 0.0


@dataclass
class FanIn:
    children: int
    enqueue_seconds: float  # the one enqueue_many of the graph
    to_fan_in_start: float  # worker start -> the fan-in's first line
    runs_of_fan_in: int


def _wait_all(url: str, ids: list[int], ready: Any, timeout: float) -> None:
    """In the waiters' process: one wait_for per id, all at once."""
    async def main() -> None:
        app = Akadze(url)
        waits = [asyncio.create_task(wait_for(app, job_id, timeout=timeout)) for job_id in ids]
        with connect(url) as conn:  # ready once every waiter has marked its job
            while True:
                row = conn.execute("SELECT count(*) FROM akadze.jobs WHERE awaited").fetchone()
                if row and int(str(row[0])) >= len(ids):
                    break
                await asyncio.sleep(0.05)
        ready.set()
        await asyncio.gather(*waits)

    asyncio.run(main())


async def _run_once(url: str, jobs: int, slots: int, waiters: bool) -> float:
    bench = _Noop(url, jobs)
    process = None
    with connect(url) as conn:
        _reset(conn)
        conn.execute("INSERT INTO akadze.jobs (queue, task) "
                     "SELECT 'default', %s FROM generate_series(1, %s)", (TASK, jobs))
        conn.execute("VACUUM ANALYZE akadze.jobs")
        if waiters:
            rows = conn.execute("SELECT id FROM akadze.jobs WHERE id %% %s = 0 ORDER BY id",
                                (WAITER_EVERY,)).fetchall()
            ids = [int(str(r[0])) for r in rows]
            spawn = multiprocessing.get_context("spawn")
            ready = spawn.Event()
            process = spawn.Process(target=_wait_all, args=(url, ids, ready, 600.0),
                                    daemon=True)
            process.start()
            if not await asyncio.to_thread(ready.wait, 120):
                raise click.ClickException("the waiters did not start within 120 s")
        began = time.perf_counter()
        async with Worker(bench.app, slots=slots, poll_interval=1.0, lease=60) as worker:
            async with asyncio.timeout(max(60, jobs / 500)):
                await bench.finished.wait()
            await worker.wait_idle()
            seconds = time.perf_counter() - began
        if process is not None:
            await asyncio.to_thread(process.join, 60)
            if process.exitcode != 0:
                raise click.ClickException(f"the waiters ended with {process.exitcode}")
    return jobs / seconds


def measure_waiters(url: str, jobs: int, slots: int, rounds: int) -> WaiterRuns:
    """``rounds`` runs of each kind, alternated (without, with, without, ...)."""
    runs = WaiterRuns(jobs, [], [])
    for _ in range(rounds):
        runs.without.append(asyncio.run(_run_once(url, jobs, slots, False)))
        runs.with_waiters.append(asyncio.run(_run_once(url, jobs, slots, True)))
    return runs


async def measure_fan_in(url: str, children: int, slots: int) -> FanIn:
    """``children`` jobs of one task and one fan-in of another that waits for all of
    them, in one ``app.enqueue_many``."""
    app = Akadze(url)
    started: dict[str, float] = {}
    done = asyncio.Event()

    @app.task("bench.child")
    async def child() -> None:
        pass

    @app.task("bench.fan_in")
    async def fan_in() -> None:
        started.setdefault("at", time.perf_counter())
        done.set()

    with connect(url) as conn:
        _reset(conn)
        items = [child.job() for _ in range(children)]
        began = time.perf_counter()
        ids = await app.enqueue_many([*items, fan_in.job(after=items)])
        enqueue_seconds = time.perf_counter() - began
        conn.execute("VACUUM ANALYZE akadze.jobs")
        conn.execute("VACUUM ANALYZE akadze.job_dependencies")
        began = time.perf_counter()
        async with Worker(app, slots=slots, poll_interval=1.0, lease=60) as worker:
            async with asyncio.timeout(max(120, children / 200)):
                await done.wait()
            await worker.wait_idle()
        row = conn.execute("SELECT run_count FROM akadze.jobs WHERE id = %s",
                           (ids[-1],)).fetchone()
    return FanIn(children, enqueue_seconds, started["at"] - began,
                 int(str(row[0])) if row else 0)
