"""The fault scenarios of ``akadze bench faults``: one fault each, seeded, bounded in time.

Every scenario runs real ``akadze worker`` processes (:mod:`fault_cluster`) on a
scratch database of a private server (:mod:`fault_server`), enqueues a seeded
workload, injects its fault while the load runs, then waits for every job to finish
and audits the promises (:mod:`fault_harness`). Nothing supervises the workers.
"""

from __future__ import annotations

import random
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ..claim import claim
from . import queries
from .fault_cluster import Cluster
from .fault_harness import Audit, Monitor, Workload, audit, enqueue_workload, log_counts, prepare
from .fault_server import PrivateServer
from .fault_tasks import QUEUE

Conn = psycopg.Connection[Any]


@dataclass
class Options:
    jobs: int = 3000
    workers: int = 4
    slots: int = 8
    seed: int = 1
    lease: float = 2.5
    recovery_timeout: float = 120.0
    fault_seconds: float = 8.0  # how long the timed faults last (terminate, timeouts)
    logdir: Path = Path("/tmp")
    # The workers' URL instead of the scratch database's own (a conninfo in, one out):
    # the same database through PgBouncer, say; with worker_args for `akadze worker`.
    worker_url: Callable[[str], str] | None = None
    worker_args: tuple[str, ...] = ()


@dataclass
class Context:
    name: str
    options: Options
    rng: random.Random
    url: str
    server: PrivateServer | None
    cluster: Cluster
    monitor: Monitor
    notes: list[str] = field(default_factory=list)
    faults: int = 0
    last_fault: float = 0.0
    phases: list[tuple[str, ...]] = field(default_factory=list)
    expected: int = 0  # jobs enqueued in total (a producer may add more while it runs)

    def connect(self) -> Conn:
        return psycopg.connect(self.url, autocommit=True, application_name="akadze-fault")

    def fault(self) -> None:
        self.faults += 1
        self.last_fault = time.monotonic()


@dataclass
class ScenarioResult:
    name: str
    title: str
    seed: int
    jobs: int
    workers: int
    lease: float
    faults: int
    audit: Audit
    max_running: dict[str, tuple[int, int]]
    samples: int
    over_samples: int
    recovery: float | None  # seconds from the last fault until every job finished
    backlog_at_last_fault: int
    elapsed: float
    unplanned_deaths: int
    started_processes: int
    logs: Counter[str]
    notes: list[str]
    phases: list[tuple[str, ...]]
    intervals: list[tuple[float, int]]

    @property
    def lost(self) -> int:
        return self.audit.unfinished

    @property
    def ok(self) -> bool:
        a = self.audit
        return (self.lost == 0 and self.recovery is not None and a.violations == 0
                and a.rate_violations == 0
                and self.over_samples == 0 and a.tx_wrong_effects == 0
                and a.effects_of_unfinished == 0 and a.stale_effects == 0
                and a.stale_results == 0 and self.unplanned_deaths == 0)


# -- the faults -------------------------------------------------------------------------


def _busy_worker(ctx: Context, conn: Conn) -> int | None:
    """A live worker index that runs jobs right now (any live one if none runs)."""
    alive = ctx.cluster.alive()
    ctx.rng.shuffle(alive)
    for worker in alive:
        rows = conn.execute(queries.get("fault_worker_jobs"),
                            {"worker_id": worker.worker_id}).fetchall()
        if rows:
            return worker.index
    return alive[0].index if alive else None


def kill9(ctx: Context) -> None:
    """kill -9 of a busy worker, repeatedly; each killed worker is started again a
    moment later (a deploy), the others keep working."""
    kills = 6
    in_flight = 0
    with ctx.connect() as conn:
        for _ in range(kills):
            time.sleep(ctx.rng.uniform(0.6, 1.6))
            index = _busy_worker(ctx, conn)
            if index is None:
                break
            worker = ctx.cluster.procs[index]
            in_flight += len(conn.execute(queries.get("fault_worker_jobs"),
                                          {"worker_id": worker.worker_id}).fetchall())
            ctx.cluster.kill(index)
            ctx.fault()
            time.sleep(ctx.rng.uniform(0.3, 1.0))
            ctx.cluster.start(index)
    ctx.notes.append(f"{ctx.faults} workers killed with SIGKILL holding {in_flight} running "
                     "jobs; each restarted under a new worker id 0.3-1 s later")


def terminate(ctx: Context) -> None:
    """pg_terminate_backend on random worker connections (claims, outcome writes,
    heartbeats, LISTEN), for a while."""
    ends = time.monotonic() + ctx.options.fault_seconds
    kinds: Counter[str] = Counter()
    with ctx.connect() as conn:
        while time.monotonic() < ends:
            rows = conn.execute(queries.get("fault_backends")).fetchall()
            busy = [r for r in rows if r[2] in ("active", "idle in transaction")]
            pool = busy if busy and ctx.rng.random() < 0.7 else rows
            if pool:
                pid, app, state = ctx.rng.choice(pool)
                conn.execute(queries.get("fault_terminate"), {"pid": pid})
                kinds[f"{app} ({state})"] += 1
                ctx.fault()
            time.sleep(ctx.rng.uniform(0.03, 0.25))
    ctx.notes.append("terminated: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common()))


def restart(ctx: Context) -> None:
    """The server restarted under load: fast shutdown, then immediate (crash
    recovery), then fast again."""
    if ctx.server is None:
        raise ValueError("the restart scenario needs a private server")
    for mode in ("fast", "immediate", "fast"):
        time.sleep(ctx.rng.uniform(1.5, 2.5))
        down = ctx.server.restart(mode, down=ctx.rng.uniform(0.5, 1.5))
        ctx.fault()
        ctx.notes.append(f"restart -m {mode}: {down:.1f} s without a server")


def timeouts(ctx: Context) -> None:
    """Another session holds limits rows (FOR NO KEY UPDATE, as a claim does) in bursts
    while the workers run with tiny lock_timeout / statement_timeout settings: claims time
    out inside."""
    keys = ["run2a", "run2b", "run3", "rate20", "rate15", "both"]
    ends = time.monotonic() + ctx.options.fault_seconds
    holds = 0
    with ctx.connect() as conn:
        while time.monotonic() < ends:
            chosen = ctx.rng.sample(keys, ctx.rng.randint(1, 3))
            with conn.transaction():
                conn.execute(queries.get("fault_hold_limits"), {"keys": chosen})
                time.sleep(ctx.rng.uniform(0.4, 1.2))
            holds += 1
            ctx.fault()
            time.sleep(ctx.rng.uniform(0.1, 0.5))
    ctx.notes.append(f"{holds} lock holds of 1-3 limits rows (0.4-1.2 s each); workers 0 and "
                     "2: lock_timeout=100ms, workers 1 and 3: statement_timeout=250ms")


def timeout_urls(url: str, workers: int) -> dict[int, str]:
    urls = {}
    for index in range(workers):
        opts = ("-c lock_timeout=100 -c statement_timeout=5000" if index % 2 == 0
                else "-c statement_timeout=250")
        urls[index] = make_conninfo(url, options=opts)
    return urls


def sigstop(ctx: Context) -> None:
    """SIGSTOP a busy worker until its lease expired and its jobs were rescued and
    claimed by another worker, then SIGCONT: its stale finishes must not land."""
    stopped_ids: list[str] = []
    with ctx.connect() as conn:
        for _ in range(2):
            time.sleep(ctx.rng.uniform(1.0, 2.0))
            index = _busy_worker(ctx, conn)
            if index is None:
                break
            worker = ctx.cluster.procs[index]
            rows = conn.execute(queries.get("fault_worker_jobs"),
                                {"worker_id": worker.worker_id}).fetchall()
            ids, rcs = [int(r[0]) for r in rows], [int(r[1]) for r in rows]
            ctx.cluster.signal(index, signal.SIGSTOP)
            began = time.monotonic()
            moved = taken = 0
            while time.monotonic() - began < 60:
                row = conn.execute(queries.get("fault_jobs_moved_on"), {
                    "ids": ids, "run_counts": rcs, "worker_id": worker.worker_id}).fetchone()
                assert row is not None
                moved, taken = int(row[0]), int(row[1])
                if moved == len(ids) and (taken > 0 or not ids):
                    break
                time.sleep(0.05)
            paused = time.monotonic() - began
            ctx.cluster.signal(index, signal.SIGCONT)
            ctx.fault()
            stopped_ids.append(worker.worker_id)
            ctx.notes.append(
                f"{worker.worker_id} stopped {paused:.1f} s with {len(ids)} running jobs: "
                f"{moved} rescued, {taken} already claimed again by another worker; then "
                "SIGCONT")
            time.sleep(2.0)
    stale = log_counts("\n".join(
        w.log.read_text(errors="replace") for w in ctx.cluster.procs.values()
        if w.worker_id in stopped_ids))
    ctx.notes.append(
        f"stopped workers after SIGCONT: {stale['self-fenced']} self-fenced, "
        f"{stale['outcome discarded']} outcome writes refused by the fence, "
        f"{stale['run lost its job']} complete_tx refused (JobLost), "
        f"{stale['registered again']} re-registrations")


# -- long transaction -------------------------------------------------------------------


def long_txn(ctx: Context) -> None:
    """A REPEATABLE READ transaction holds its snapshot while the queue churns: vacuum
    cannot clean. Throughput, claim time (a probe claiming one job) and dead tuples
    before, during and after it."""
    stop = threading.Event()
    produced = [0]
    producer = threading.Thread(target=_produce, args=(ctx, stop, produced), daemon=True)
    producer.start()
    phases = (("before", 8.0, False), ("during", 16.0, True), ("after", 12.0, False))
    with ctx.connect() as probe, ctx.connect() as stats:
        holder: Conn | None = None
        for phase, seconds, hold in phases:
            if hold:
                holder = psycopg.connect(ctx.url, application_name="akadze-fault-longtxn")
                holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                holder.execute(queries.get("fault_long_snapshot"))
                ctx.fault()
            elif holder is not None:
                holder.commit()
                holder.close()
                holder = None
                ctx.fault()
            began = time.monotonic()
            finished0 = ctx.monitor.finished
            timings = []
            while time.monotonic() - began < seconds:
                timings.append(_probe(probe))
                time.sleep(0.2)
            done = ctx.monitor.finished - finished0
            row = stats.execute(queries.get("fault_table_stats")).fetchone()
            assert row is not None
            timings.sort()
            ctx.phases.append((
                phase, f"{seconds:g}", f"{done / seconds:.0f}",
                f"{statistics.median(timings):.1f}",
                f"{timings[int(len(timings) * 0.95) - 1]:.1f}",
                f"{int(row[3]):,}".replace(",", " "),
                f"{int(row[0]) // 1024:,}".replace(",", " "),
                f"{int(row[1]) // 1024:,}".replace(",", " "),
            ))
    stop.set()
    producer.join(30)
    ctx.expected += produced[0]
    ctx.notes.append(f"a producer kept ~2 000 jobs queued (1-5 ms each) and enqueued "
                     f"{produced[0]} in total; the snapshot was held for 16 s")


def _produce(ctx: Context, stop: threading.Event, produced: list[int]) -> None:
    rng = random.Random(ctx.options.seed + 1)
    batch = Workload(jobs=500, ms=(1, 5), fail=0.0, tx=0.3, keyed=0.2)
    with ctx.connect() as conn:
        while not stop.is_set():
            if ctx.monitor.queued < 2000:
                produced[0] += enqueue_workload(conn, batch, rng, first=10_000_000 + produced[0])
            stop.wait(0.2)


def scenario(name: str) -> Scenario:
    for found in SCENARIOS:
        if found.name == name:
            return found
    raise KeyError(name)


def _probe(conn: Conn) -> float:
    """ms of one claim of one job on the churning queue; the probe then finishes the
    job as the task would (fenced), so the audit still holds."""
    began = time.perf_counter()
    got = claim(conn, queue=QUEUE, slots=1, worker_id="fault-probe")
    ms = (time.perf_counter() - began) * 1000
    for job in got:
        conn.execute(queries.get("fault_probe_complete"),
                     {"id": job.id, "run_count": job.run_count})
    return ms


# -- registry and runner ----------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    inject: Callable[[Context], None]
    workload: Workload = field(default_factory=Workload)
    urls: Callable[[str, int], dict[int, str]] | None = None


SCENARIOS = (
    Scenario("kill9", "kill -9 of busy workers, repeatedly", kill9),
    Scenario("terminate", "pg_terminate_backend on worker connections", terminate),
    Scenario("restart", "server restart (fast, immediate, fast)", restart),
    Scenario("timeouts", "lock and statement timeouts inside the claim", timeouts,
             urls=timeout_urls),
    Scenario("long-txn", "long REPEATABLE READ transaction holding back vacuum", long_txn,
             workload=Workload(jobs=2000, ms=(1, 5), fail=0.0, tx=0.3, keyed=0.2)),
    Scenario("sigstop", "SIGSTOP past the lease, then SIGCONT (fencing)", sigstop,
             workload=Workload(ms=(150, 600))),
)
SCENARIO_NAMES = [s.name for s in SCENARIOS]


def run_scenario(scenario: Scenario, options: Options, server: PrivateServer | str,
                 say: Callable[[str], None] = lambda _: None) -> ScenarioResult:
    """Run one scenario in a scratch database of ``server``: a private server, or the
    admin URL of another (every scenario but ``restart``, which stops the server)."""
    rng = random.Random(f"{scenario.name}:{options.seed}")
    if isinstance(server, str):
        admin_url, private = server, None
    else:
        admin_url, private = server.admin_url(), server
    name = f"akadze_fault_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(admin_url, dbname=name)
    logdir = options.logdir / f"{scenario.name}-{options.seed}"
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        workload = Workload(**{**scenario.workload.__dict__,
                               "jobs": min(scenario.workload.jobs, options.jobs)
                               if scenario.name == "long-txn" else options.jobs})
        with psycopg.connect(url, autocommit=True) as conn:
            prepare(conn)
            expected = enqueue_workload(conn, workload, rng)
        monitor = Monitor(url).start()
        workers_url = options.worker_url(url) if options.worker_url else url
        cluster = Cluster(workers_url, logdir, workers=options.workers, slots=options.slots,
                          lease=options.lease, worker_args=options.worker_args,
                          urls=scenario.urls(workers_url, options.workers)
                          if scenario.urls else {})
        ctx = Context(scenario.name, options, rng, url, private, cluster, monitor,
                      expected=expected)
        began = time.monotonic()
        cluster.start_all()
        try:
            monitor.wait_progress(min(50, expected), 120)
            say(f"{scenario.name}: load running, injecting faults")
            scenario.inject(ctx)
            backlog = max(ctx.expected - monitor.finished, 0)
            say(f"{scenario.name}: faults over ({ctx.faults}), {backlog} jobs left")
            done_at = monitor.wait_finished(ctx.expected, options.recovery_timeout)
            recovery = None if done_at is None else max(done_at - ctx.last_fault, 0.0)
            elapsed = time.monotonic() - began
            deaths = len(cluster.dead())
        finally:
            cluster.stop_all()
            monitor.stop()
        with psycopg.connect(url, autocommit=True) as conn:
            found = audit(conn)
        return ScenarioResult(
            scenario.name, scenario.title, options.seed, ctx.expected, options.workers,
            options.lease, ctx.faults, found, dict(monitor.max_running), monitor.samples,
            monitor.over_samples, recovery, backlog, elapsed, deaths, cluster.started,
            log_counts(cluster.logs()), ctx.notes, ctx.phases,
            [(i.at, i.finished) for i in monitor.intervals])
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
