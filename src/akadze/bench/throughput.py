"""``akadze bench throughput``: how fast one worker process runs jobs, and how soon it
starts a new one.

Throughput: a backlog of ``--jobs`` no-op jobs is inserted, then a worker starts in
this process (``--slots`` slots on one queue); the clock runs from the worker's
start (its connections included) until the last outcome is written. Reported as
jobs per second. Every run has a scratch database of its own. By default the
backlog is vacuumed and analyzed before the worker starts (*fresh* statistics);
with ``--stale-stats`` each run is also made on *stale* ones, as a burst into a
quiet queue meets them: the tables analyzed while empty, then the backlog
inserted, no ANALYZE before or during the drain. Autovacuum is kept off the
queue's tables in both, so that the statistics are the only difference; the two
runs of a cell alternate which goes first.

Pick-up latency: ``--samples`` single enqueues, each committed on its own from a
separate thread while the worker is idle, each waited for before the next; the
latency is the time from the commit's return (and from just before the commit was
sent) to the start of the task, both read from the same clock in this process.

Runs in scratch databases created (and dropped) on the server of the URL.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import psycopg

from ..app import Akadze
from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from ..worker import Worker
from .claim_scenarios import stale_tables
from .claims import host_details, scratch_database
from .hostcpu import at_most, own_seconds, postmaster_of, server_seconds
from .workflows import WAITER_EVERY, FanIn, WaiterRuns, measure_fan_in, measure_waiters

Conn = psycopg.Connection[Any]

TASK = "bench.noop"


@dataclass
class Throughput:
    jobs: int
    slots: int
    seconds: float
    stale: bool = False
    #: CPU seconds of the drain: this process's (the worker's) and the server's
    #: (None when the server is not a process of this host: hostcpu).
    worker_cpu: float = 0.0
    server_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")

    def cpu_per_job(self) -> tuple[float, float] | None:
        """Microseconds of CPU a job: the worker's, the server's."""
        if self.server_cpu is None or not self.jobs:
            return None
        return self.worker_cpu / self.jobs * 1e6, self.server_cpu / self.jobs * 1e6


@dataclass
class Cell:
    """The runs of one backlog and slot count: fresh statistics, and stale ones
    when asked; the median of each is reported."""

    jobs: int
    slots: int
    fresh: list[Throughput]
    stale: list[Throughput]

    @staticmethod
    def median(runs: Sequence[Throughput]) -> float:
        return statistics.median(r.rate for r in runs) if runs else float("nan")

    def cpu_line(self) -> str | None:
        """The CPU a job of the cell's runs (medians over every run), and how many
        jobs a second this host's cores could run at that cost."""
        costs = [c for c in (r.cpu_per_job() for r in self.fresh + self.stale) if c]
        if not costs:
            return None
        worker = statistics.median(c[0] for c in costs)
        server = statistics.median(c[1] for c in costs)
        cores, most = at_most((worker + server) / 1e6)
        return (f"{self.jobs:,} jobs, {self.slots} slots: worker {worker:.0f} us + server "
                f"{server:.0f} us a job; {cores} cores run at most "
                f"{most:,.0f} jobs/s at that cost")

    def row(self) -> tuple[str, ...]:
        fresh, stale = self.median(self.fresh), self.median(self.stale)
        cells = [f"{self.jobs:,}", str(self.slots), str(len(self.fresh)), f"{fresh:,.0f}"]
        if self.stale:
            cells += [f"{stale:,.0f}", f"{stale / fresh:.2f}"]
        return tuple(cells)


@dataclass
class Latency:
    after_commit: list[float]  # seconds, commit returned -> task started
    before_commit: list[float]  # seconds, commit sent -> task started

    @staticmethod
    def _pct(values: Sequence[float], share: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(len(ordered) * share))]

    def row(self, values: Sequence[float], label: str) -> tuple[str, ...]:
        return (label, str(len(values)), f"{statistics.median(values) * 1000:.2f}",
                f"{self._pct(values, 0.99) * 1000:.2f}", f"{max(values) * 1000:.2f}")


class _Bench:
    """The app and the signals between the task and the bench."""

    def __init__(self, url: str) -> None:
        self.app = Akadze(url)
        self.target = 0
        self.done = 0
        self.finished = asyncio.Event()
        self.started_at: float = 0.0
        self.started = threading.Event()

        @self.app.task(TASK)
        async def noop() -> None:
            if self.target < 0:  # latency: tell the enqueuing thread
                self.started_at = time.perf_counter()
                self.started.set()
                return
            self.done += 1
            if self.done == self.target:
                self.finished.set()


def _reset(conn: Conn) -> None:
    conn.execute("TRUNCATE akadze.jobs, akadze.workers, akadze.job_dependencies")


async def measure_throughput(url: str, jobs: int, slots: int,
                             stale: bool = False) -> Throughput:
    """One drain of ``jobs`` no-op jobs by a worker of ``slots`` slots, in the
    scratch database ``url`` (which it empties first)."""
    bench = _Bench(url)
    bench.target = jobs
    with connect(url) as conn:
        _reset(conn)
        stale_tables(conn)
        if stale:
            # Statistics of the empty tables, as autovacuum takes them on a
            # quiet queue; the burst then comes with no ANALYZE.
            conn.execute("ANALYZE akadze.jobs, akadze.workers")
        conn.execute("INSERT INTO akadze.jobs (queue, task) "
                     "SELECT 'default', %s FROM generate_series(1, %s)", (TASK, jobs))
        if not stale:
            # A backlog that has been there a while has been analyzed.
            conn.execute("VACUUM ANALYZE akadze.jobs")
        postmaster = postmaster_of(conn)
        server_began = None if postmaster is None else server_seconds(postmaster)
        cpu_began = own_seconds()
        began = time.perf_counter()
        async with Worker(bench.app, slots=slots, poll_interval=1.0, lease=60) as worker:
            try:
                # generous: a shared machine can be 50 times slower than the target
                async with asyncio.timeout(max(120, jobs / 50)):  # not wait_for: Worker._wait
                    await bench.finished.wait()
            except TimeoutError:
                raise click.ClickException(
                    f"{bench.done} of {jobs} jobs ran within {max(120, jobs / 50):.0f} s "
                    f"({slots} slots)") from None
            await worker.wait_idle()
            seconds = time.perf_counter() - began
        worker_cpu = own_seconds() - cpu_began
        # after the worker stopped: its backends' time is the postmaster's now
        server_ended = None if postmaster is None else server_seconds(postmaster, 0.1)
        row = conn.execute("SELECT count(*) FROM akadze.jobs WHERE state = 'succeeded'"
                           ).fetchone()
    if not row or int(str(row[0])) != jobs:
        raise click.ClickException(f"expected {jobs} succeeded jobs, found {row}")
    server_cpu = (server_ended - server_began
                  if server_began is not None and server_ended is not None else None)
    return Throughput(jobs, slots, seconds, stale, worker_cpu, server_cpu)


def _enqueue_one(conn: Conn, bench: _Bench) -> tuple[float, float]:
    task = bench.app.tasks[TASK]
    bench.started.clear()
    with conn.transaction():
        task.using(session=conn).enqueue_sync()
        before = time.perf_counter()
    after = time.perf_counter()
    if not bench.started.wait(10):
        raise click.ClickException("a job was not picked up within 10 s")
    return bench.started_at - after, bench.started_at - before


async def measure_latency(url: str, samples: int, slots: int) -> Latency:
    bench = _Bench(url)
    bench.target = -1
    after: list[float] = []
    before: list[float] = []
    with connect(url) as admin:
        _reset(admin)
    with psycopg.connect(url) as conn:
        async with Worker(bench.app, slots=slots, poll_interval=1.0, lease=60) as worker:
            for number in range(samples + 5):
                a, b = await asyncio.to_thread(_enqueue_one, conn, bench)
                await worker.wait_idle()
                if number >= 5:  # the first few warm up connections and plans
                    after.append(a)
                    before.append(b)
    return Latency(after, before)


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _workflow_lines(waiters: WaiterRuns | None, fan_in: FanIn | None) -> list[str]:
    lines: list[str] = []
    if waiters is not None:
        lines += [
            "",
            f"## With one waiter per {WAITER_EVERY} jobs (`wait_for`)",
            "",
            f"{waiters.jobs:,} no-op jobs per run; runs alternated (without, with, ...); "
            f"the waiters are {waiters.jobs // WAITER_EVERY} concurrent `wait_for` calls in "
            "a process of their own (sharing one connection), started before the worker.",
            "",
            "| run | nobody waits, jobs/s | one waiter per 100 jobs, jobs/s |",
            "|---:|---:|---:|",
        ]
        for n, (a, b) in enumerate(zip(waiters.without, waiters.with_waiters, strict=True), 1):
            lines.append(f"| {n} | {a:,.0f} | {b:,.0f} |")
        lines += [
            f"| median | {statistics.median(waiters.without):,.0f} | "
            f"{statistics.median(waiters.with_waiters):,.0f} |",
            "",
            f"Cost of the waiters: {waiters.cost:.1%} of the median throughput. A job nobody "
            "waits for costs nothing more at its terminal write (the trigger's WHEN is "
            "false: no function call, no notification).",
        ]
    if fan_in is not None:
        lines += [
            "",
            "## Fan-out / fan-in",
            "",
            f"{fan_in.children:,} children of one task and one fan-in of another that waits "
            "for all of them, enqueued in one `app.enqueue_many`; then one worker runs them.",
            "",
            "| children | enqueue of the graph, s | worker start -> fan-in starts, s | "
            "runs of the fan-in |",
            "|---:|---:|---:|---:|",
            f"| {fan_in.children:,} | {fan_in.enqueue_seconds:.2f} | "
            f"{fan_in.to_fan_in_start:.2f} | {fan_in.runs_of_fan_in} |",
        ]
    return lines


def write_report(path: Path, host: dict[str, str], cells: Sequence[Cell],
                 latency: Latency | None, latency_slots: int = 0,
                 waiters: WaiterRuns | None = None, fan_in: FanIn | None = None) -> None:
    stale = any(c.stale for c in cells)
    lines = [
        "# Worker throughput and pick-up latency",
        "",
        "Measured with `akadze bench throughput` (one worker process, asyncio, no-op async "
        "task, one queue; outcomes written in batches; LISTEN/NOTIFY on).",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        f"Load average (1/5/15 min) when the run ended: {_loadavg()}: the machine is "
        "shared, so read the figures with that in mind.",
        "",
        "## Throughput",
        "",
        "*Fresh*: the backlog vacuumed and analyzed before the worker starts. "
        + ("*Stale*: the tables analyzed while empty, then the backlog inserted, no "
           "ANALYZE before or during the drain (a burst into a quiet queue). The two "
           "runs of a cell alternate which goes first; jobs/s are medians of the runs. "
           if stale else "")
        + "Autovacuum is kept off the queue's tables during the runs.",
        "",
        "| backlog | slots | runs | fresh jobs/s |" + (" stale jobs/s | stale / fresh |"
                                                      if stale else ""),
        "|---:|---:|---:|---:|" + ("---:|---:|" if stale else ""),
    ]
    for cell in cells:
        lines.append("| " + " | ".join(cell.row()) + " |")
    cpu = [line for line in (cell.cpu_line() for cell in cells) if line]
    if cpu:
        lines += ["", "CPU of the drains (this process, which runs the worker, and every "
                  "process of the server, from the worker's start to its end; medians of "
                  "the cell's runs):", "", *(f"- {line}." for line in cpu)]
    if latency is not None:
        lines += [
            "",
            f"## Pick-up latency (idle worker of {latency_slots} slots, single enqueues)",
            "",
            "| measured from | samples | p50 ms | p99 ms | max ms |",
            "|---|---:|---:|---:|---:|",
        ]
        for label, values in (("commit returned", latency.after_commit),
                              ("commit sent", latency.before_commit)):
            lines.append("| " + " | ".join(latency.row(values, label)) + " |")
    lines += _workflow_lines(waiters, fan_in)
    lines += [
        "",
        "## Method",
        "",
        "- Throughput: each run in a scratch database of its own; the clock runs from the "
        "worker's start (connections included) until the last outcome is written. Claims "
        "take every free slot in one call; outcomes are written many per statement, each "
        "row fenced by its claim token.",
        "- Claims commit with `synchronous_commit = off` (the default, "
        "`durable_claims=False`); outcome writes commit durably (they wait for the WAL "
        "flush). See docs/explanation/job-states.md.",
        "- Pick-up latency: one job enqueued and committed at a time from another thread "
        "(`enqueue_sync`), the next only after the previous one ran; from the commit's "
        "return (and from just before it was sent) to the task's first line, on one clock. "
        "The first five samples warm up and are not counted.",
        "",
        "Reproduce: `akadze bench throughput --stale-stats --report "
        "benchmarks/throughput.md --database-url "
        "postgresql://postgres@127.0.0.1:5432/postgres`.",
    ]
    path.write_text("\n".join(lines) + "\n")


@click.command("throughput")
@click.option("--jobs", "sizes", multiple=True, type=click.IntRange(1),
              help="Backlog sizes to run (repeatable; default: 10000 and 100000).")
@click.option("--slots", "slot_counts", multiple=True, type=click.IntRange(1),
              help="Worker slots on the queue, jobs claimed per claim at most "
              "(repeatable; default: 20, 100 and 1000).")
@click.option("--stale-stats", is_flag=True,
              help="Also run every cell on stale statistics (tables analyzed while "
              "empty, then the backlog, no ANALYZE), beside the fresh run.")
@click.option("--repeat", type=click.IntRange(1, 20), default=1, show_default=True,
              help="Runs per cell (and per statistics); the median is reported.")
@click.option("--samples", type=click.IntRange(0), default=200, show_default=True,
              help="Single enqueues for the pick-up latency (0 skips it).")
@click.option("--waiter-rounds", type=click.IntRange(0), default=3, show_default=True,
              help="Alternated runs without and with one wait_for per 100 jobs (0 skips).")
@click.option("--waiter-jobs", type=click.IntRange(100), default=20_000, show_default=True,
              help="Backlog of each of those runs.")
@click.option("--fan-out", type=click.IntRange(0), default=10_000, show_default=True,
              help="Children of the fan-out/fan-in run (0 skips it).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@database_url_option
def command(sizes: tuple[int, ...], slot_counts: tuple[int, ...], stale_stats: bool,
            repeat: int, samples: int, waiter_rounds: int, waiter_jobs: int, fan_out: int,
            report: Path | None,
            database_url: str | None) -> None:
    """Jobs per second of one worker process, and enqueue-to-start latency."""
    url = resolve(database_url)
    sizes = sizes or (10_000, 100_000)
    slot_counts = slot_counts or (20, 100, 1000)
    click.echo(f"benching on {describe(url)}")
    cells: list[Cell] = []
    latency: Latency | None = None
    with scratch_database(url, False) as scratch, connect(scratch) as conn:
        host = host_details(conn)
    for size in sizes:
        for slots in slot_counts:
            cell = Cell(size, slots, [], [])
            for number in range(repeat):
                kinds = (False, True) if stale_stats else (False,)
                if stale_stats and (len(cells) + number) % 2:
                    kinds = (True, False)
                for stale in kinds:
                    # a database of its own: statistics an earlier run left
                    # (ANALYZE of an empty table keeps the old ones) cannot leak in
                    with scratch_database(url, False) as scratch:
                        result = asyncio.run(measure_throughput(scratch, size, slots, stale))
                    (cell.stale if stale else cell.fresh).append(result)
                    cost = result.cpu_per_job()
                    click.echo(f"{size} jobs, {slots} slots, "
                               f"{'stale' if stale else 'fresh'}: {result.seconds:.2f} s, "
                               f"{result.rate:,.0f} jobs/s" + (
                                   f" (CPU a job: worker {cost[0]:.0f} us, server "
                                   f"{cost[1]:.0f} us)" if cost else ""))
            cells.append(cell)
    waiters = fan_in = None
    with scratch_database(url, False) as scratch:
        if samples:
            latency = asyncio.run(measure_latency(scratch, samples, slot_counts[0]))
        if waiter_rounds:
            waiters = measure_waiters(scratch, waiter_jobs, slot_counts[0], waiter_rounds)
            click.echo(f"one waiter per {WAITER_EVERY} jobs costs {waiters.cost:.1%} "
                       "of the median throughput")
        if fan_out:
            fan_in = asyncio.run(measure_fan_in(scratch, fan_out, slot_counts[0]))
            click.echo(f"fan-out of {fan_out}: the fan-in started "
                       f"{fan_in.to_fan_in_start:.2f} s after the worker")
    columns = ["backlog", "slots", "runs", "fresh jobs/s"]
    if stale_stats:
        columns += ["stale jobs/s", "stale / fresh"]
    print_table("throughput", columns, [cell.row() for cell in cells])
    if latency is not None:
        print_table("pick-up latency", ["from", "samples", "p50 ms", "p99 ms", "max ms"],
                    [latency.row(latency.after_commit, "commit returned"),
                     latency.row(latency.before_commit, "commit sent")])
    if report is not None:
        write_report(report, host, cells, latency, slot_counts[0], waiters, fan_in)
        click.echo(f"report written to {report}")
