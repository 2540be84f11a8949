"""The demo's plan and its checks (pure): what ``akadze demo`` runs, and how its
outcome is judged from the jobs' final rows and the sampled peaks.

:mod:`akadze.bench.demo` runs the plan; this module does no I/O.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median

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
# ... and at least this many starts: below it, one start more or less swings the ratio
# by a tenth. The plan gives every unlimited tenant more jobs than this, and the first
# to run out has started all of them, so only a starved tenant falls below it.
MIN_FAIR_STARTS = 10
MIN_TENANT_JOBS = 12
RETRY_DELAY = timedelta(milliseconds=200)
#: Jobs, seconds: what ``--jobs`` and ``--seconds`` accept.
MAX_JOBS = 1_000_000
MAX_SECONDS = 3_600.0
#: The default budget: 60 s, or for a small --jobs less, at this many jobs a second.
DEFAULT_SECONDS = 60.0
JOBS_PER_SECOND = 40
MIN_SECONDS = 5.0


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


def default_seconds(jobs: int | None) -> float:
    """The budget when ``--seconds`` is not given: 60 s, or less for a small ``--jobs``
    (the time of JOBS_PER_SECOND jobs a second, at least MIN_SECONDS)."""
    if jobs is None:
        return DEFAULT_SECONDS
    return min(DEFAULT_SECONDS, max(MIN_SECONDS, jobs / JOBS_PER_SECOND))


def make_plan(jobs: int, seconds: float, slots: int = SLOTS, run_id: str | None = None) -> Plan:
    """Size the workload so that the backlog takes about BUSY_FRACTION of ``seconds``."""
    if not 100 <= jobs <= MAX_JOBS:
        raise ValueError(f"--jobs must be between 100 and {MAX_JOBS:,}")
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(f"--seconds must be between {MIN_SECONDS:g} and {MAX_SECONDS:g}")
    run_id = run_id or uuid.uuid4().hex[:8]
    busy = seconds * BUSY_FRACTION
    duration = min(2.0, max(0.005, slots * busy / jobs))
    tenants = []
    # The urgent batch is spread evenly over the unlimited tenants: it shifts no
    # tenant's share, so the fairness check can count every start.
    urgent = max(2, jobs // 120)
    for name, share, limit in TENANTS:
        count = max(MIN_TENANT_JOBS, round(jobs * share))
        tenant = TenantPlan(name=name, key=f"demo-{run_id}:{name}", jobs=count, flaky=0, urgent=0)
        if limit == "running":
            # MAX_RUNNING slots must finish this tenant's backlog within the busy time.
            count = min(count, int(MAX_RUNNING * busy * 0.8 / duration))
            tenant = TenantPlan(name, tenant.key, count, 0, 0, max_running=MAX_RUNNING)
        elif limit == "starts":
            rate = max(1, round(count / (busy * 0.8)))  # starts per second
            tenant = TenantPlan(name, tenant.key, count, 0, 0, max_starts=rate, window=1.0)
        elif name == "acme":  # the largest tenant also carries the failing jobs
            tenant = TenantPlan(name, tenant.key, count, flaky=max(5, jobs // 25), urgent=urgent)
        else:
            tenant = TenantPlan(name, tenant.key, count, 0, urgent=urgent)
        tenants.append(tenant)
    return Plan(run_id, f"demo-{run_id}", slots, seconds, duration, tuple(tenants))


# -- what the demo sees (pure) ----------------------------------------------------------


@dataclass
class Counts:
    """One tenant in one snapshot (the columns of ``demo_snapshot``, in order)."""

    queued: int = 0  # retrying ones included
    retrying: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    starts_in_window: int = 0
    urgent: int = 0  # urgent jobs enqueued so far
    urgent_succeeded: int = 0


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
    backlog = {
        name: [r for r in group if r.priority == 0 and r.started_at is not None]
        for name, group in by_tenant.items()
    }
    # The contended period: until the first unlimited tenant ran out of its backlog
    # (its last start). Until then every tenant had work waiting.
    unlimited = [t.name for t in plan.tenants if not t.limited]
    ends = [max(r.started_at for r in backlog[n] if r.started_at)
            for n in unlimited if backlog[n]]
    contended_end = min(ends) if ends else None
    # Every start by then counts, urgent jobs and failed runs included: the fair
    # claim balances the jobs each group runs, whatever their priority.
    contended = {
        name: sum(r.runs_until(contended_end) for r in group) if contended_end else 0
        for name, group in by_tenant.items()
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
    ratio = low / high if high else 0.0
    shown = ", ".join(f"{name} {n}" for name, n in counts.items())
    ok = low >= MIN_FAIR_STARTS and ratio >= FAIR_RATIO
    # The ratio is shown rounded down, so that a failing one never reads as passing.
    detail = (f"starts while every tenant had work: {shown} (least/most "
              f"{math.floor(ratio * 100) / 100:.2f}, needs >= {FAIR_RATIO:.2f} and at least "
              f"{MIN_FAIR_STARTS} each)")
    tenants = [t for t in plan.tenants if t.name in counts]
    biggest = max(tenants, key=lambda t: t.jobs)
    backlog = sum(t.jobs for t in tenants)
    if high:
        detail += (f"; {biggest.name} holds {biggest.jobs / backlog:.0%} of their backlog and "
                   f"was enqueued first: it got {counts[biggest.name] / sum(counts.values()):.0%}"
                   " of their starts")
    return Check("fair share", ok, detail)


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
