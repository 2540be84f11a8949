"""``akadze demo``: a multi-tenant workload on a fair worker, checked from the database.

Five tenants of very different sizes share one queue; each tenant is a
``limit_key`` (its fair group). Two tenants carry limits: one at most
``max_running`` jobs at once, one at most ``max_starts`` starts per window.
Some jobs fail once or twice and succeed on a retry; a batch of urgent
(high-priority) jobs, spread evenly over the unlimited tenants, arrives while
the backlog is being worked. One fair worker runs it all, and the demo proves
from the database that

- while every tenant still had work, the unlimited tenants got comparable
  numbers of starts (however large their backlogs): every start counts, the
  urgent ones and the failed runs too, since the fair claim balances the jobs
  each group runs whatever their priority;
- no limit was exceeded (peaks sampled from the database many times a second,
  and every start of the rate-limited tenant checked against its window);
- the failing jobs retried and then succeeded;
- the urgent jobs jumped the queue.

The plan and the checks are pure (:mod:`akadze.bench.demo_plan`); this module
runs them. A run removes its own jobs, limits and start marks when it ends (also
when it is interrupted) unless asked to keep its jobs; :func:`clean` removes what
earlier runs left. Its queue is ``demo-<run id>`` and its limit keys
``demo-<run id>:<tenant>`` (the patterns ``bench/sql/demo.sql`` cleans by).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .. import limits
from ..app import Akadze
from ..database import connect_async
from ..migrate import migrate_connection_async
from . import queries
from .demo_plan import (
    RETRY_DELAY,
    URGENT_AFTER,
    Counts,
    JobRow,
    Peaks,
    Plan,
    Result,
    Snapshot,
    evaluate,
)

# -- running it ------------------------------------------------------------------------


@dataclass
class _Bodies:
    """Task bodies running right now in this process, per tenant, and their peaks."""

    now: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)

    def enter(self, tenant: str) -> None:
        self.now[tenant] = self.now.get(tenant, 0) + 1
        self.peak[tenant] = max(self.peak.get(tenant, 0), self.now[tenant])

    def leave(self, tenant: str) -> None:
        self.now[tenant] -= 1


def build_app(url: str, plan: Plan, bodies: _Bodies) -> Akadze:
    app = Akadze(database_url=url)
    failures: dict[str, int] = {}

    @app.task("demo.work", queue=plan.queue)
    async def work(tenant: str, seconds: float) -> None:
        bodies.enter(tenant)
        try:
            await asyncio.sleep(seconds)
        finally:
            bodies.leave(tenant)

    @app.task("demo.flaky", queue=plan.queue, max_attempts=4, backoff=lambda _: RETRY_DELAY)
    async def flaky(tenant: str, seconds: float, token: str, fail_times: int) -> None:
        bodies.enter(tenant)
        try:
            await asyncio.sleep(seconds)
            failures[token] = failures.get(token, 0) + 1
            if failures[token] <= fail_times:
                raise RuntimeError(
                    f"simulated outage ({failures[token]} of {fail_times} planned failures)"
                )
        finally:
            bodies.leave(tenant)

    return app


def _durations(plan: Plan, count: int, rng: random.Random) -> list[float]:
    return [round(plan.duration * rng.uniform(0.5, 1.5), 4) for _ in range(count)]


async def _enqueue_backlog(conn: psycopg.AsyncConnection[Any], app: Akadze, plan: Plan) -> None:
    """The backlog in FIFO order of tenant size: a plain FIFO queue would serve the
    largest tenant first and the others only after it.

    Every tenant's n-th job lasts as long as every other tenant's n-th job: the fair
    claim shares slots (running jobs), and with the same durations equal slot time
    means equal numbers of starts, which is what the fairness check counts."""
    rng = random.Random(plan.run_id)
    durations = _durations(plan, max(t.jobs for t in plan.tenants), rng)
    work, flaky = app.get_task("demo.work"), app.get_task("demo.flaky")
    async with conn.transaction():
        for tenant in sorted(plan.tenants, key=lambda t: -t.jobs):
            if tenant.flaky:  # first in their tenant: their retries resolve mid-run
                failing = [
                    {"tenant": tenant.name, "seconds": s, "token": f"{tenant.name}-{i}",
                     "fail_times": 1 + i % 2}
                    for i, s in enumerate(durations[: tenant.flaky])
                ]
                await flaky.using(session=conn, limit_key=tenant.key).enqueue_many(failing)
            items = [{"tenant": tenant.name, "seconds": s}
                     for s in durations[tenant.flaky : tenant.jobs]]
            await work.using(session=conn, limit_key=tenant.key).enqueue_many(items)


async def _enqueue_urgent(conn: psycopg.AsyncConnection[Any], app: Akadze, plan: Plan) -> None:
    rng = random.Random(plan.run_id + "urgent")
    durations = _durations(plan, max(t.urgent for t in plan.tenants), rng)
    work = app.get_task("demo.work")
    async with conn.transaction():
        for tenant in plan.tenants:
            if tenant.urgent:
                items = [{"tenant": tenant.name, "seconds": s}
                         for s in durations[: tenant.urgent]]
                await work.using(session=conn, limit_key=tenant.key, priority=10).enqueue_many(
                    items
                )


async def _snapshot(conn: psycopg.AsyncConnection[Any], plan: Plan, started: float) -> Snapshot:
    cur = await conn.execute(queries.get("demo_snapshot"), {"queue": plan.queue})
    tenants = {t.name: Counts() for t in plan.tenants}
    for key, *numbers in await cur.fetchall():
        tenant = plan.tenant_of(key)
        if tenant is not None:
            tenants[tenant.name] = Counts(*(int(n) for n in numbers))
    return Snapshot(time.monotonic() - started, tenants)


async def _rows(conn: psycopg.AsyncConnection[Any], plan: Plan) -> list[JobRow]:
    cur = await conn.execute(queries.get("demo_jobs"), {"queue": plan.queue})
    found = []
    for key, task, priority, state, attempt, failed_at, created, started, finished in (
        await cur.fetchall()
    ):
        tenant = plan.tenant_of(key)
        found.append(JobRow(tenant.name if tenant else str(key), task, priority, state,
                            attempt, tuple(failed_at), created, started, finished))
    return found


async def remove(conn: psycopg.AsyncConnection[Any], queues: Sequence[str]) -> int:
    """Remove the jobs, limits, start marks and pauses of the demo runs of ``queues``
    (in one transaction); return how many jobs went."""
    params = {"queues": list(queues)}
    async with conn.transaction():
        cur = await conn.execute(queries.get("demo_remove_jobs"), params)
        removed = cur.rowcount
        for name in ("demo_remove_limits", "demo_remove_marks", "demo_remove_pauses"):
            await conn.execute(queries.get(name), params)
    return removed


async def clean(url: str) -> tuple[int, int]:
    """Remove what earlier demo runs left (see ``demo_leftover_runs``); return how many
    runs and jobs went."""
    async with await connect_async(url) as conn:
        cur = await conn.execute(queries.get("demo_leftover_runs"))
        queues = [str(row[0]) for row in await cur.fetchall()]
        return len(queues), (await remove(conn, queues) if queues else 0)


async def run(
    url: str,
    plan: Plan,
    *,
    on_snapshot: Callable[[Snapshot, Peaks], None] | None = None,
    keep: bool = False,
    sample_every: float = 0.05,
    report_every: float = 0.25,
) -> Result:
    """Migrate, set the limits, enqueue, run a fair worker until the work is done or
    ``plan.seconds`` passed, and check the outcome from the database.

    Whatever happens (an interruption too), the run's limits and start marks are
    removed at the end, and so are its jobs unless ``keep``."""
    bodies = _Bodies()
    app = build_app(url, plan, bodies)
    peaks = Peaks()
    async with await connect_async(url) as conn:
        await migrate_connection_async(conn)
        try:
            rows, elapsed = await _work(conn, app, plan, peaks, on_snapshot,
                                        sample_every, report_every)
        finally:
            if not conn.closed and not conn.broken:
                await remove(conn, [] if keep else [plan.queue])
                for tenant in plan.tenants:
                    if keep and tenant.limited:
                        await limits.clear_limit(conn, tenant.key)
    peaks.bodies = dict(bodies.peak)
    return evaluate(plan, rows, peaks, elapsed)


async def _work(
    conn: psycopg.AsyncConnection[Any], app: Akadze, plan: Plan, peaks: Peaks,
    on_snapshot: Callable[[Snapshot, Peaks], None] | None,
    sample_every: float, report_every: float,
) -> tuple[list[JobRow], float]:
    """Set the limits, enqueue, run the worker, sample; the final rows and the time."""
    from ..worker import Worker

    for tenant in plan.tenants:
        if tenant.max_running is not None:
            await limits.set_limit(conn, tenant.key, max_running=tenant.max_running)
        if tenant.max_starts is not None:
            await limits.set_limit(
                conn, tenant.key, max_starts=tenant.max_starts, window=tenant.window
            )
    await _enqueue_backlog(conn, app, plan)
    started = time.monotonic()
    worker = Worker(app, queues=[plan.queue], slots=plan.slots, fair=True)
    running = asyncio.create_task(worker.run())
    urgent_sent = False
    last_report = 0.0
    finished = False
    try:
        while True:
            snapshot = await _snapshot(conn, plan, started)
            peaks.add(snapshot)
            if not urgent_sent and snapshot.finished >= URGENT_AFTER * plan.total:
                await _enqueue_urgent(conn, app, plan)
                urgent_sent = True
            done = urgent_sent and snapshot.finished >= plan.total
            if on_snapshot and (done or snapshot.elapsed - last_report >= report_every):
                last_report = snapshot.elapsed
                on_snapshot(snapshot, peaks)
            if done or snapshot.elapsed >= plan.seconds or running.done():
                break
            await asyncio.sleep(sample_every)
        finished = True
    finally:
        worker.stop()
        if not finished:  # interrupted: stop at once, the jobs go with the run
            worker.stop()
        await running
    elapsed = time.monotonic() - started
    return await _rows(conn, plan), elapsed
