"""``akadze bench dashboard``: every page and API answer of the web dashboard, timed
over HTTP against a table of a million jobs.

The data set (bench/sql/dashboard.sql, loaded with INSERT ... SELECT generate_series in
seconds): 500 000 finished jobs over the last day (one in 60 failed with a traceback,
one in 250 cancelled), 400 000 queued over 2 000 limited tenants in three queues (one
in ten scheduled, one in twenty at a higher priority), 100 running (their tenants at
their limit of one), and 99 900 queued for the night in a fourth queue: 1 000 000
jobs. Then VACUUM ANALYZE, as autovacuum would have done.

The dashboard is served by uvicorn on a loopback port, as ``akadze dashboard`` serves
it; each path is requested ``--warmup`` times, then ``--requests`` times, one request
at a time; the report gives the median and the slowest of each.

Runs in a scratch database created (and dropped) on the server of the URL, unless
``--in-place`` names a database it may fill.
"""

from __future__ import annotations

import os
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from . import queries
from .claims import _md_table, host_details, scratch_database
from .dashboard_serving import serving

TARGET_MS = 100.0
SIZES = {"keys": 2000, "running": 100, "finished": 500_000, "queued": 400_000,
         "later": 99_900}
#: The load, in order (bench/sql/dashboard.sql).
LOAD_STEPS = ("bench_dashboard_limits", "bench_dashboard_finished", "bench_dashboard_queued",
              "bench_dashboard_running", "bench_dashboard_later", "bench_dashboard_marks",
              "bench_dashboard_workers", "bench_dashboard_fires", "bench_dashboard_sequence")


@dataclass(frozen=True)
class Timing:
    path: str
    millis: list[float]
    size: int  # bytes of the last answer

    @property
    def median(self) -> float:
        return statistics.median(self.millis)

    @property
    def slowest(self) -> float:
        return max(self.millis)


def load(url: str) -> tuple[float, int]:
    """Fill the scratch database; returns (seconds, jobs)."""
    started = time.perf_counter()
    with connect(url) as conn:
        params: dict[str, Any] = {**SIZES, "now": datetime.now(UTC)}
        params["total"] = sum(SIZES[k] for k in ("finished", "queued", "running", "later"))
        for step in LOAD_STEPS:
            conn.execute(queries.get(step), params)
        conn.execute("VACUUM ANALYZE akadze.jobs")
        conn.execute("VACUUM ANALYZE akadze.limits")
        conn.execute("VACUUM ANALYZE akadze.start_marks")
        counted = conn.execute(queries.get("bench_dashboard_count")).fetchone()
    assert counted is not None
    return time.perf_counter() - started, int(str(counted[0]))


def paths(url: str) -> list[str]:
    """Every page and its JSON, with the job page of a failed job and the filters an
    operator uses most."""
    with connect(url) as conn:
        row = conn.execute(queries.get("bench_dashboard_failed_job")).fetchone()
    failed = int(str(row[0])) if row and row[0] else 1
    pages = ["/", "/limits", "/fairness", "/jobs", "/jobs?state=failed",
             "/jobs?queue=emails&meta=region%3Deu", "/jobs?limit_key=tenant%3A0042",
             "/jobs?state=running", f"/jobs/{failed}", "/schedules"]
    apis = ["/api/overview" if p == "/" else "/api" + p for p in pages]
    return [*pages, *apis]


def _get(address: str) -> int:
    try:
        with urllib.request.urlopen(address, timeout=30) as answer:
            return len(answer.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        raise click.ClickException(f"{address} answered {exc.code}: {detail}") from None
    except OSError as exc:
        raise click.ClickException(f"{address}: {exc}") from None


def measure(base: str, path: str, warmup: int, requests: int) -> Timing:
    for _ in range(warmup):
        _get(base + path)
    millis: list[float] = []
    size = 0
    for _ in range(requests):
        started = time.perf_counter()
        size = _get(base + path)
        millis.append((time.perf_counter() - started) * 1000)
    return Timing(path, millis, size)


def rows(timings: Sequence[Timing]) -> list[tuple[str, ...]]:
    return [(f"`{t.path}`", f"{t.median:.1f}", f"{t.slowest:.1f}", f"{t.size / 1024:.0f}",
             "yes" if t.median < TARGET_MS else "**no**") for t in timings]


COLUMNS = ("path", "median ms", "slowest ms", "KiB", f"median < {TARGET_MS:.0f} ms")


def write_report(path: Path, host: dict[str, str], jobs: int, seconds: float,
                 requests: int, warmup: int, timings: Sequence[Timing], load_avg: str) -> None:
    worst = max(timings, key=lambda t: t.median)
    text = [
        "# akadze bench dashboard",
        "",
        f"Generated by `akadze bench dashboard --requests {requests} --warmup {warmup}`.",
        "",
        "## Host",
        "",
        _md_table(("", ""), [*host.items(), ("load average at start", load_avg)]),
        "",
        "## Data set",
        "",
        f"{jobs:,} jobs in akadze.jobs, loaded in {seconds:.0f} s with INSERT ... SELECT "
        "generate_series (bench/sql/dashboard.sql), then VACUUM ANALYZE: 500,000 finished over "
        "the last day (1 in 60 failed with a traceback, 1 in 250 cancelled), 400,000 queued "
        "over 2,000 limited tenants in three queues (1 in 10 scheduled, 1 in 20 at priority "
        "5), 100 running (their tenants at their limit), 99,900 queued for the night in a "
        "fourth queue; 2,000 limits rows (200 with a start rate and 40 recent starts each), "
        "4 workers, 2 schedules with a day of fires.",
        "",
        "## Every page and API answer",
        "",
        f"Served by uvicorn on a loopback port as `akadze dashboard` serves it; each path "
        f"requested {warmup} times to warm up, then {requests} times, one at a time "
        "(the time of the whole HTTP request as the client sees it).",
        "",
        f"**Slowest median: {worst.median:.1f} ms** (`{worst.path}`); target: every "
        f"median under {TARGET_MS:.0f} ms: "
        f"{'met' if worst.median < TARGET_MS else '**not met**'}.",
        "",
        _md_table(COLUMNS, rows(timings)),
        "",
        "No page counts the whole table: queued jobs are counted on their partial "
        "indexes up to 10,000 per priority (`10 000+` beyond), finished jobs through a "
        "sample of the latest 20,000 finishes, the table's size per state is the "
        "planner's estimate, and the jobs list walks at most 10,000 jobs per page.",
        "",
    ]
    path.write_text("\n".join(text))


@click.command("dashboard")
@click.option("--requests", type=click.IntRange(1, 1000), default=15, show_default=True,
              help="Timed requests per path.")
@click.option("--warmup", type=click.IntRange(0, 100), default=3, show_default=True,
              help="Untimed requests per path first.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a Markdown report here (e.g. benchmarks/dashboard.md).")
@click.option("--in-place", is_flag=True,
              help="Fill the database of the URL itself instead of a scratch database.")
@database_url_option
def command(requests: int, warmup: int, report: Path | None, in_place: bool,
            database_url: str | None) -> None:
    """Time every dashboard page and API answer against a million jobs."""
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise click.UsageError("the dashboard bench needs the dashboard extra "
                               "(pip install 'akadze[dashboard]')") from None
    url = resolve(database_url)
    load_avg = " ".join(f"{v:.2f}" for v in os.getloadavg())
    click.echo(f"bench dashboard on {describe(url)}", err=True)
    with scratch_database(url, in_place) as scratch:
        seconds, jobs = load(scratch)
        click.echo(f"loaded {jobs:,} jobs in {seconds:.0f} s", err=True)
        with connect(scratch) as conn:
            host = host_details(conn)
        from ..dashboard import create_app

        with serving(create_app(scratch)) as base:
            timings = [measure(base, p, warmup, requests) for p in paths(scratch)]
    print_table("dashboard", COLUMNS, rows(timings))
    if report is not None:
        write_report(report, host, jobs, seconds, requests, warmup, timings, load_avg)
        click.echo(f"report written to {report} ({datetime.now(UTC):%H:%M} UTC)", err=True)
