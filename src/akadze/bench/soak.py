"""``akadze bench soak``: several workers for several minutes, watched for drift.

Worker processes (``akadze worker``, every second one in fair order) run a mixed
workload on a private PostgreSQL 16 server: tight concurrency limits, start-rate
limits, keyless jobs, injected failures (retries), complete_tx writes. A producer
keeps a backlog queued, so the workers run flat out and throughput is what they can
do. Every interval the soak records jobs finished per second, the backlog, the
jobs table's heap and index sizes (and the ready index alone), dead tuples and
vacuums, and the resident memory of each worker. At the end it audits the run
like the fault scenarios do (nothing lost, no limit exceeded).

What "flat" means is left to the reader of the table, with one figure to help: the
throughput of the last third of the run against the first third.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from . import queries
from .fault_cluster import Cluster
from .fault_harness import Audit, Monitor, Workload, audit, enqueue_workload, prepare
from .fault_server import private_server

Conn = psycopg.Connection[Any]

BACKLOG = 1_000
BATCH = Workload(jobs=500, ms=(1, 20), fail=0.05, tx=0.3, keyed=0.4)


@dataclass
class Sample:
    at: float
    per_second: float
    queued: int
    heap_kib: int
    index_kib: int
    ready_index_kib: int
    live: int
    dead: int
    vacuums: int
    rss_kib: dict[str, int]


@dataclass
class SoakResult:
    minutes: float
    workers: int
    slots: int
    samples: list[Sample] = field(default_factory=list)
    enqueued: int = 0
    audit: Audit | None = None
    over_samples: int = 0
    max_running: dict[str, tuple[int, int]] = field(default_factory=dict)
    unplanned_deaths: int = 0
    drain_seconds: float | None = None

    @property
    def drift(self) -> float | None:
        """Throughput of the last third over the first third (1.0 = flat)."""
        rates = [s.per_second for s in self.samples[1:]]  # the first includes start-up
        third = len(rates) // 3
        if third == 0:
            return None
        first = statistics.mean(rates[:third])
        return statistics.mean(rates[-third:]) / first if first else None


def _produce(url: str, stop: threading.Event, monitor: Monitor, seed: int,
             counter: list[int]) -> None:
    rng = random.Random(seed)
    with psycopg.connect(url, autocommit=True, application_name="akadze-soak-producer") as conn:
        while not stop.is_set():
            if monitor.queued < BACKLOG:
                counter[0] += enqueue_workload(conn, BATCH, rng, first=counter[0])
            stop.wait(0.1)


def run_soak(minutes: float, workers: int, slots: int, interval: float, seed: int,
             logdir: Path, say: Any = None) -> tuple[dict[str, str], SoakResult]:
    echo = say or (lambda m: click.echo(m, err=True))
    from .claims import host_details  # imports the CLI, which imports this module

    result = SoakResult(minutes, workers, slots)
    with private_server() as server:
        admin_url = server.admin_url()
        name = f"akadze_soak_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(admin_url, autocommit=True) as admin:
            host = host_details(admin)
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = make_conninfo(admin_url, dbname=name)
        with psycopg.connect(url, autocommit=True) as conn:
            prepare(conn)
        monitor = Monitor(url, period=0.25).start()
        cluster = Cluster(url, logdir, workers=workers, slots=slots, lease=10.0,
                          poll_interval=0.5)
        stop = threading.Event()
        counter = [0]
        producer = threading.Thread(target=_produce, args=(url, stop, monitor, seed, counter),
                                    daemon=True)
        producer.start()
        cluster.start_all()
        began = time.monotonic()
        try:
            with psycopg.connect(url, autocommit=True) as stats:
                last_done, last_at = 0, began
                while time.monotonic() - began < minutes * 60:
                    stop.wait(min(interval, max(0.0, began + minutes * 60 - time.monotonic())))
                    row = stats.execute(queries.get("soak_stats")).fetchone()
                    assert row is not None
                    now = time.monotonic()
                    done = int(row[6])
                    sample = Sample(
                        round(now - began), (done - last_done) / (now - last_at), int(row[7]),
                        int(row[0]) // 1024, int(row[1]) // 1024, int(row[2]) // 1024,
                        int(row[3]), int(row[4]), int(row[5]), cluster.rss_kib())
                    result.samples.append(sample)
                    last_done, last_at = done, now
                    echo(f"{sample.at:>5} s: {sample.per_second:7.0f} jobs/s, queued "
                         f"{sample.queued}, heap {sample.heap_kib} KiB, dead {sample.dead}, "
                         f"RSS {max(sample.rss_kib.values(), default=0) // 1024} MiB max")
            stop.set()
            producer.join(30)
            result.enqueued = counter[0]
            drain_began = time.monotonic()
            if monitor.wait_finished(result.enqueued, 300) is not None:
                result.drain_seconds = time.monotonic() - drain_began
            result.unplanned_deaths = len(cluster.dead())
        finally:
            stop.set()
            cluster.stop_all()
            monitor.stop()
        result.over_samples = monitor.over_samples
        result.max_running = dict(monitor.max_running)
        with psycopg.connect(url, autocommit=True) as conn:
            result.audit = audit(conn)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    return host, result


COLUMNS = ("t s", "jobs/s", "queued", "heap KiB", "indexes KiB", "ready index KiB",
           "live tuples", "dead tuples", "vacuums", "worker RSS MiB (each)")


def rows(result: SoakResult) -> list[tuple[str, ...]]:
    return [(str(s.at), f"{s.per_second:.0f}", str(s.queued), f"{s.heap_kib:,}",
             f"{s.index_kib:,}", f"{s.ready_index_kib:,}", f"{s.live:,}", f"{s.dead:,}",
             str(s.vacuums),
             " ".join(f"{v / 1024:.0f}" for _, v in sorted(s.rss_kib.items())))
            for s in result.samples]


def report_text(host: dict[str, str], result: SoakResult) -> str:
    a = result.audit
    lines = [
        "## Soak (`akadze bench soak`)",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        f"{result.workers} worker processes x {result.slots} slots for "
        f"{result.minutes:g} min on a private PostgreSQL 16 server (autovacuum at its "
        f"defaults); a producer keeps about {BACKLOG} jobs queued (1-20 ms each, 40% over "
        "six limit keys with max_running 2-3 and start rates of 15-25/s, 5% fail their "
        "first attempt, 30% write through complete_tx). Finished jobs stay in the table "
        "(retention is days), so the heap grows with the work done; the ready index and "
        "the dead tuples are what must not spiral.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(r) + " |" for r in rows(result)),
        "",
    ]
    drift = result.drift
    lines.append(f"- throughput, last third / first third: "
                 f"{'-' if drift is None else f'{drift:.2f}'}")
    lines.append(f"- enqueued {result.enqueued}; drained in "
                 + ("(not within 300 s)" if result.drain_seconds is None
                    else f"{result.drain_seconds:.1f} s") + " after the producer stopped")
    if a is not None:
        lines.append(
            f"- audit: {a.succeeded} succeeded, {a.states.get('failed', 0)} failed, "
            f"{a.unfinished} unfinished; limit violations {a.violations} (commit trigger), "
            f"{a.rate_violations} (start-rate windows), {result.over_samples} (samples); "
            f"complete_tx effects wrong {a.tx_wrong_effects + a.effects_of_unfinished}, "
            f"stale finishes {a.stale_effects + a.stale_results}; worker processes died "
            f"unplanned: {result.unplanned_deaths}")
        lines.append(f"- start-rate windows over max_starts by commit time: "
                     f"{a.commit_rate_violations}")
        lines += [f"- {detail}" for detail in a.details]
    lines.append("- max running per key: " + ", ".join(
        f"{k} {m}/{lim}" for k, (m, lim) in sorted(result.max_running.items())))
    return "\n".join(lines) + "\n"


@click.command("soak")
@click.option("--minutes", type=click.FloatRange(0.1, 24 * 60), default=5.0, show_default=True)
@click.option("--workers", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option("--slots", type=click.IntRange(1, 100), default=8, show_default=True)
@click.option("--interval", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="Seconds between samples.")
@click.option("--seed", type=click.IntRange(0), default=1, show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
def command(minutes: float, workers: int, slots: int, interval: float, seed: int,
            report: Path | None) -> None:
    """Run workers for --minutes on a mixed workload; report drift, bloat and memory."""
    from ..cli.options import print_table  # the CLI imports this module

    with tempfile.TemporaryDirectory(prefix="akadze-soak-logs-") as tmp:
        host, result = run_soak(minutes, workers, slots, interval, seed, Path(tmp))
    print_table("soak", COLUMNS, rows(result))
    if report is not None:
        report.write_text(report_text(host, result), encoding="utf-8")
        click.echo(f"report written to {report}")
