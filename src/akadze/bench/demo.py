"""``akadze demo``: a multi-tenant workload on a fair worker, checked from the database.

Five tenants of very different sizes share one queue; each tenant is a
``limit_key`` (its fair group). Two tenants carry limits: one at most
``max_running`` jobs at once, one at most ``max_starts`` starts per window.
Some jobs fail once or twice and succeed on a retry; a batch of urgent
(high-priority) jobs arrives while the backlog is being worked. One fair
worker runs it all, and the demo proves from the database that

- while every tenant still had work, the unlimited tenants got comparable
  numbers of starts (however large their backlogs);
- no limit was exceeded (peaks sampled from the database many times a second,
  and every start of the rate-limited tenant checked against its window);
- the failing jobs retried and then succeeded;
- the urgent jobs jumped the queue.

The first half is pure (the plan, the checks); the second half runs it.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import Any

import psycopg

from ..app import Akadze
from ..migrate import migrate_connection_async
from . import queries

# name, share of the backlog, limit ("running", "starts" or None)
TENANTS: tuple[tuple[str, float, str | None], ...] = (
    ("acme", 0.42, None),
    ("globex", 0.24, None),
    ("hooli", 0.12, None),
    ("initech", 0.10, "running"),
    ("umbrella", 0.12, "starts"),
)
SLOTS = 16
MAX_RUNNING = 2
BUSY_FRACTION = 0.4  # of --seconds the backlog should take; the rest is margin
URGENT_AFTER = 0.15  # the urgent batch arrives when this share of the backlog is done
FAIR_RATIO = 0.67  # the least served unlimited tenant gets at least this share of the most
RETRY_DELAY = timedelta(milliseconds=200)


# -- the plan (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class TenantPlan:
    name: str
    key: str
    jobs: int  # backlog jobs, flaky ones included, urgent ones not
    flaky: int
    urgent: int
    max_running: int | None = None
    max_starts: int | None = None
    window: float | None = None

    @property
    def limited(self) -> bool:
        return self.max_running is not None or self.max_starts is not None

    def limit_text(self) -> str:
        if self.max_running is not None:
            return f"max_running {self.max_running}"
        if self.max_starts is not None:
            return f"max_starts {self.max_starts}/{self.window:g}s"
        return "-"


@dataclass(frozen=True)
class Plan:
    run_id: str
    queue: str
    slots: int
    seconds: float
    duration: float  # mean job duration (uniform in [0.5, 1.5] of it)
    tenants: tuple[TenantPlan, ...]

    @property
    def total(self) -> int:
        return sum(t.jobs + t.urgent for t in self.tenants)

    def tenant_of(self, key: str | None) -> TenantPlan | None:
        return next((t for t in self.tenants if t.key == key), None)


def make_plan(jobs: int, seconds: float, slots: int = SLOTS, run_id: str | None = None) -> Plan:
    """Size the workload so that the backlog takes about BUSY_FRACTION of ``seconds``."""
    if jobs < 100:
        raise ValueError("--jobs must be at least 100")
    if seconds < 5:
        raise ValueError("--seconds must be at least 5")
    run_id = run_id or uuid.uuid4().hex[:8]
    busy = seconds * BUSY_FRACTION
    duration = min(2.0, max(0.005, slots * busy / jobs))
    tenants = []
    for name, share, limit in TENANTS:
        count = max(10, round(jobs * share))
        tenant = TenantPlan(name=name, key=f"demo-{run_id}:{name}", jobs=count, flaky=0, urgent=0)
        if limit == "running":
            # MAX_RUNNING slots must finish this tenant's backlog within the busy time.
            count = min(count, int(MAX_RUNNING * busy * 0.8 / duration))
            tenant = TenantPlan(name, tenant.key, count, 0, 0, max_running=MAX_RUNNING)
        elif limit == "starts":
            rate = max(1, round(count / (busy * 0.8)))  # starts per second
            tenant = TenantPlan(name, tenant.key, count, 0, 0, max_starts=rate, window=1.0)
        elif name == "acme":  # the largest tenant also carries the failing jobs
            tenant = TenantPlan(name, tenant.key, count, flaky=max(5, jobs // 25), urgent=0)
        elif name == "globex":  # the urgent batch is a middle tenant's
            tenant = TenantPlan(name, tenant.key, count, 0, urgent=max(5, jobs // 40))
        tenants.append(tenant)
    return Plan(run_id, f"demo-{run_id}", slots, seconds, duration, tuple(tenants))


# -- what the demo sees (pure) ----------------------------------------------------------


@dataclass
class Counts:
    queued: int = 0
    retrying: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    starts_in_window: int = 0


@dataclass(frozen=True)
class Snapshot:
    elapsed: float
    tenants: dict[str, Counts]

    @property
    def finished(self) -> int:
        return sum(c.succeeded + c.failed for c in self.tenants.values())


@dataclass
class Peaks:
    """The highest values seen per tenant: in database snapshots, and in task bodies
    running at once in this process (a lower bound of the database's running count)."""

    snapshots: int = 0
    running: dict[str, int] = field(default_factory=dict)
    starts_in_window: dict[str, int] = field(default_factory=dict)
    bodies: dict[str, int] = field(default_factory=dict)

    def add(self, snapshot: Snapshot) -> None:
        self.snapshots += 1
        for name, counts in snapshot.tenants.items():
            self.running[name] = max(self.running.get(name, 0), counts.running)
            self.starts_in_window[name] = max(
                self.starts_in_window.get(name, 0), counts.starts_in_window
            )


@dataclass(frozen=True)
class JobRow:
    tenant: str
    task: str
    priority: int
    state: str
    attempt: int
    failed_at: tuple[datetime, ...]  # one per failed run, when it failed
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def errors(self) -> int:
        return len(self.failed_at)

    def runs_until(self, moment: datetime) -> int:
        """Runs started by ``moment``: failed runs (they failed after they started, so
        one that failed by then started by then) and the last run."""
        last = 1 if self.started_at is not None and self.started_at <= moment else 0
        return last + sum(1 for at in self.failed_at if at <= moment)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class TenantSummary:
    name: str
    limit: str
    jobs: int
    backlog_share: float
    starts_while_contended: int
    contended_share: float
    peak_running: int
    peak_starts: int


@dataclass(frozen=True)
class Result:
    plan: Plan
    elapsed: float
    tenants: tuple[TenantSummary, ...]
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def max_in_window(starts: Sequence[datetime], window: timedelta) -> int:
    """The most starts within any window ``(s - window, s]``."""
    ordered = sorted(starts)
    best, first = 0, 0
    for last, at in enumerate(ordered):
        while ordered[first] <= at - window:
            first += 1
        best = max(best, last - first + 1)
    return best


def evaluate(plan: Plan, rows: Sequence[JobRow], peaks: Peaks, elapsed: float) -> Result:
    """The summary and the checks, from the jobs' final rows and the sampled peaks."""
    by_tenant: dict[str, list[JobRow]] = {t.name: [] for t in plan.tenants}
    for row in rows:
        by_tenant.setdefault(row.tenant, []).append(row)
    normal = {
        name: [r for r in group if r.priority == 0 and r.started_at is not None]
        for name, group in by_tenant.items()
    }
    # The contended period: until the first unlimited tenant ran out of queued work
    # (its last start). Until then every tenant had work waiting.
    unlimited = [t.name for t in plan.tenants if not t.limited]
    ends = [max(r.started_at for r in normal[n] if r.started_at) for n in unlimited if normal[n]]
    contended_end = min(ends) if ends else None
    contended = {
        name: sum(r.runs_until(contended_end) for r in group) if contended_end else 0
        for name, group in normal.items()
    }
    all_contended = sum(contended.values()) or 1
    total_backlog = sum(t.jobs for t in plan.tenants)
    summaries = tuple(
        TenantSummary(
            name=t.name,
            limit=t.limit_text(),
            jobs=t.jobs + t.urgent,
            backlog_share=t.jobs / total_backlog,
            starts_while_contended=contended.get(t.name, 0),
            contended_share=contended.get(t.name, 0) / all_contended,
            peak_running=max(peaks.running.get(t.name, 0), peaks.bodies.get(t.name, 0)),
            peak_starts=max(peaks.starts_in_window.get(t.name, 0), _exact_starts(t, by_tenant)),
        )
        for t in plan.tenants
    )
    checks = [_fairness(plan, contended, unlimited)]
    checks += [_limit(t, by_tenant[t.name], peaks) for t in plan.tenants if t.limited]
    checks.append(_retries(by_tenant))
    checks.append(_urgent(rows))
    checks.append(_finished(plan, rows))
    return Result(plan, elapsed, summaries, tuple(checks))


def _exact_starts(tenant: TenantPlan, by_tenant: dict[str, list[JobRow]]) -> int:
    if tenant.window is None:
        return 0
    starts = [r.started_at for r in by_tenant.get(tenant.name, []) if r.started_at]
    return max_in_window(starts, timedelta(seconds=tenant.window))


def _fairness(plan: Plan, contended: dict[str, int], unlimited: list[str]) -> Check:
    counts = {name: contended.get(name, 0) for name in unlimited}
    low, high = min(counts.values()), max(counts.values())
    shown = ", ".join(f"{name} {n}" for name, n in counts.items())
    biggest = max(plan.tenants, key=lambda t: t.jobs)
    ok = high > 0 and low >= 10 and low / high >= FAIR_RATIO
    return Check(
        "fair share",
        ok,
        f"starts while every tenant had work: {shown} (least/most {low / max(high, 1):.2f}, "
        f"needs >= {FAIR_RATIO}); {biggest.name} holds the largest backlog and was "
        "enqueued first, yet got no more than the others",
    )


def _limit(tenant: TenantPlan, rows: list[JobRow], peaks: Peaks) -> Check:
    if tenant.max_running is not None:
        seen = peaks.running.get(tenant.name, 0)
        bodies = peaks.bodies.get(tenant.name, 0)
        ok = seen <= tenant.max_running and bodies <= tenant.max_running
        return Check(
            f"{tenant.name} max_running {tenant.max_running}",
            ok,
            f"peak running {seen} in {peaks.snapshots} database snapshots; "
            f"peak {bodies} task bodies at once",
        )
    assert tenant.max_starts is not None and tenant.window is not None
    exact = max_in_window([r.started_at for r in rows if r.started_at],
                          timedelta(seconds=tenant.window))
    seen = peaks.starts_in_window.get(tenant.name, 0)
    ok = exact <= tenant.max_starts and seen <= tenant.max_starts
    return Check(
        f"{tenant.name} max_starts {tenant.max_starts}/{tenant.window:g}s",
        ok,
        f"most starts in any {tenant.window:g}s window: {exact} (from every job's start "
        f"time); peak {seen} recorded starts in {peaks.snapshots} snapshots",
    )


def _retries(by_tenant: dict[str, list[JobRow]]) -> Check:
    flaky = [r for group in by_tenant.values() for r in group if r.task == "demo.flaky"]
    healed = [r for r in flaky if r.state == "succeeded" and r.errors >= 1 and r.attempt > 1]
    retries = sum(r.errors for r in healed)
    return Check(
        "retries resolved",
        bool(flaky) and len(healed) == len(flaky),
        f"{len(healed)} of {len(flaky)} failing jobs succeeded after {retries} failed runs",
    )


def _urgent(rows: Sequence[JobRow]) -> Check:
    def waits(urgent: bool) -> list[float]:
        return [
            (r.started_at - r.created_at).total_seconds()
            for r in rows
            if r.started_at and (r.priority > 0) == urgent
        ]

    urgent, normal = waits(True), waits(False)
    if not urgent or not normal:
        return Check("urgent first", False, "no urgent job ran")
    ok = max(urgent) < median(normal)
    return Check(
        "urgent first",
        ok,
        f"{len(urgent)} urgent jobs waited at most {max(urgent):.2f}s "
        f"(median {median(urgent):.2f}s); the backlog's median wait was {median(normal):.2f}s",
    )


def _finished(plan: Plan, rows: Sequence[JobRow]) -> Check:
    done = sum(1 for r in rows if r.state == "succeeded")
    return Check(
        "all jobs done",
        done == plan.total and len(rows) == plan.total,
        f"{done} of {plan.total} jobs succeeded",
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
    largest tenant first and the others only after it."""
    rng = random.Random(plan.run_id)
    work, flaky = app.get_task("demo.work"), app.get_task("demo.flaky")
    async with conn.transaction():
        for tenant in sorted(plan.tenants, key=lambda t: -t.jobs):
            if tenant.flaky:  # first in their tenant: their retries resolve mid-run
                failing = [
                    {"tenant": tenant.name, "seconds": s, "token": f"{tenant.name}-{i}",
                     "fail_times": 1 + i % 2}
                    for i, s in enumerate(_durations(plan, tenant.flaky, rng))
                ]
                await flaky.using(session=conn, limit_key=tenant.key).enqueue_many(failing)
            plain = tenant.jobs - tenant.flaky
            items = [{"tenant": tenant.name, "seconds": s} for s in _durations(plan, plain, rng)]
            await work.using(session=conn, limit_key=tenant.key).enqueue_many(items)


async def _enqueue_urgent(conn: psycopg.AsyncConnection[Any], app: Akadze, plan: Plan) -> None:
    rng = random.Random(plan.run_id + "urgent")
    work = app.get_task("demo.work")
    async with conn.transaction():
        for tenant in plan.tenants:
            if tenant.urgent:
                items = [
                    {"tenant": tenant.name, "seconds": s}
                    for s in _durations(plan, tenant.urgent, rng)
                ]
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


async def run(
    url: str,
    plan: Plan,
    *,
    on_snapshot: Callable[[Snapshot, Peaks], None] | None = None,
    sample_every: float = 0.05,
    report_every: float = 0.25,
) -> Result:
    """Migrate, set the limits, enqueue, run a fair worker until the work is done or
    ``plan.seconds`` passed, and check the outcome from the database."""
    from .. import limits
    from ..worker import Worker

    bodies = _Bodies()
    app = build_app(url, plan, bodies)
    peaks = Peaks()
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    async with conn:
        await migrate_connection_async(conn)
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
        finally:
            worker.stop()
            await running
        elapsed = time.monotonic() - started
        peaks.bodies = dict(bodies.peak)
        rows = await _rows(conn, plan)
        for tenant in plan.tenants:
            if tenant.limited:
                await limits.clear_limit(conn, tenant.key)
    return evaluate(plan, rows, peaks, elapsed)
