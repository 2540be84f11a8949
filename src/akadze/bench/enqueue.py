"""``akadze bench enqueue``: bulk enqueue speed and where its time goes, single enqueue
latency.

Bulk: ``enqueue_many_sync`` of ``--jobs`` jobs in one call, committed, ``--repeat`` times
on an emptied table (the headline: jobs per second, median). Then the same work cut
into its steps, each timed on its own: argument validation, serialization to JSON,
id reservation, COPY formatting, the COPY itself, the commit; and the same COPY into
a copy of the table without indexes or triggers, whose difference to the real COPY is
the cost of index maintenance (and the NOTIFY trigger).

Single: ``--single`` calls of ``enqueue_sync`` in one open transaction (the round trip
of one insert), then the same each committed, with a ``unique_key`` (savepoint), and
``await enqueue`` on an async connection.

Runs in a scratch database created (and dropped) on the server of the URL.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psycopg
import pydantic_core

from .. import queries
from ..app import Akadze
from ..arguments import list_adapter as _list_adapter
from ..batches import build_batch
from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from ..enqueue import _copy_statement
from ..tasks import Task
from .claims import host_details, scratch_database

Conn = psycopg.Connection[Any]

STEPS = ("validate", "reserve ids", "serialize + format COPY", "COPY", "commit")


@dataclass
class BulkRun:
    seconds: float  # the whole enqueue_many_sync call plus commit
    steps: dict[str, float] = field(default_factory=dict)
    bare_copy: float = 0.0  # the same COPY into a table without indexes or triggers
    serialize: float = 0.0  # arguments to JSON alone (part of "serialize + format COPY")


@dataclass
class SingleResult:
    name: str
    micros: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.micros)

    @property
    def p99(self) -> float:
        ordered = sorted(self.micros)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _task(url: str) -> Task[Any]:
    app = Akadze(url)

    @app.task("bench.hello")
    def hello(name: str, n: int) -> None:  # pragma: no cover - never run
        pass

    return app.tasks["bench.hello"]


def _items(jobs: int) -> list[dict[str, Any]]:
    return [{"name": f"user{i}", "n": i} for i in range(jobs)]


def _empty(conn: Conn) -> None:
    conn.execute("TRUNCATE akadze.jobs, akadze.job_dependencies")  # edges reference jobs
    conn.commit()


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def bulk_run(conn: Conn, task: Task[Any], items: list[dict[str, Any]]) -> BulkRun:
    """One headline run, then one run cut into steps (table emptied before each)."""
    _empty(conn)
    started = time.perf_counter()
    ids = task.using(session=conn).enqueue_many_sync(items)
    conn.commit()
    run = BulkRun(time.perf_counter() - started)
    if len(ids) != len(items):  # pragma: no cover - a broken enqueue
        raise click.ClickException(f"enqueue_many returned {len(ids)} ids for {len(items)}")

    _empty(conn)
    options = task.using().options
    run.steps["validate"], batch = _timed(lambda: build_batch(task, options, items))
    adapter = _list_adapter(task)
    serialize_started = time.perf_counter()
    plain = adapter.dump_python(batch.validated, mode="json", exclude_unset=True)
    [pydantic_core.to_json(item) for item in plain]
    run.serialize = time.perf_counter() - serialize_started

    def reserve() -> tuple[Any, list[int]]:
        row = conn.execute(queries.get("reserve_job_ids"), {"count": batch.size}).fetchone()
        assert row is not None
        now, first, listed = row
        return now, list(range(first, first + batch.size)) if listed is None else listed

    run.steps["reserve ids"], (now, reserved) = _timed(reserve)
    run.steps["serialize + format COPY"], chunks = _timed(
        lambda: list(batch.copy_chunks(reserved, now))
    )
    statement = _copy_statement(batch)

    def copy(target: Any) -> None:
        with conn.cursor().copy(target) as writer:
            for chunk in chunks:
                writer.write(chunk)

    run.steps["COPY"], _ = _timed(lambda: copy(statement))
    run.steps["commit"], _ = _timed(conn.commit)

    # The same rows into a bare twin of the table: no indexes, no triggers.
    conn.execute(
        "CREATE TEMP TABLE bare_jobs (LIKE akadze.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
    )
    bare = psycopg.sql.SQL(statement.as_string(conn).replace("akadze.jobs", "bare_jobs", 1))
    run.bare_copy, _ = _timed(lambda: copy(bare))
    conn.execute("DROP TABLE bare_jobs")
    conn.commit()
    return run


def single_runs(conn: Conn, url: str, task: Task[Any], count: int) -> list[SingleResult]:
    _empty(conn)
    results: list[SingleResult] = []

    in_tx: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        task.using(session=conn).enqueue_sync(name=f"s{i}", n=i)
        in_tx.append((time.perf_counter() - started) * 1e6)
    conn.commit()
    results.append(SingleResult("enqueue_sync in an open transaction", in_tx))

    committed: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        task.using(session=conn).enqueue_sync(name=f"c{i}", n=i)
        conn.commit()
        committed.append((time.perf_counter() - started) * 1e6)
    results.append(SingleResult("enqueue_sync + commit", committed))

    unique: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        task.using(session=conn, unique_key=f"u{i}").enqueue_sync(name=f"u{i}", n=i)
        unique.append((time.perf_counter() - started) * 1e6)
    conn.commit()
    results.append(SingleResult("enqueue_sync with unique_key (savepoint)", unique))

    async def async_runs() -> list[float]:
        timings: list[float] = []
        aconn = await psycopg.AsyncConnection.connect(url)
        async with aconn:
            for i in range(count):
                started = time.perf_counter()
                await task.using(session=aconn).enqueue(name=f"a{i}", n=i)
                timings.append((time.perf_counter() - started) * 1e6)
            await aconn.commit()
        return timings

    results.append(SingleResult("await enqueue in an open transaction", asyncio.run(async_runs())))
    _empty(conn)
    return results


# -- report -----------------------------------------------------------------------------


def _rate(jobs: int, seconds: float) -> str:
    return f"{jobs / seconds:,.0f}"


def bulk_rows(jobs: int, runs: Sequence[BulkRun]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        (f"run {n}", f"{run.seconds * 1000:.0f}", _rate(jobs, run.seconds))
        for n, run in enumerate(runs, start=1)
    ]
    median = statistics.median(run.seconds for run in runs)
    rows.append(("median", f"{median * 1000:.0f}", _rate(jobs, median)))
    return rows


def step_rows(runs: Sequence[BulkRun]) -> list[tuple[str, ...]]:
    medians = {step: statistics.median(run.steps[step] for run in runs) for step in STEPS}
    total = sum(medians.values())
    rows: list[tuple[str, ...]] = [
        (step, f"{seconds * 1000:.0f}", f"{100 * seconds / total:.0f}%")
        for step, seconds in medians.items()
    ]
    rows.append(("sum of steps", f"{total * 1000:.0f}", "100%"))
    serialize = statistics.median(run.serialize for run in runs)
    rows.append(("(arguments to JSON alone, measured apart)", f"{serialize * 1000:.0f}", ""))
    bare = statistics.median(run.bare_copy for run in runs)
    indexes = medians["COPY"] - bare
    rows.append(("COPY into a bare table (no indexes, no trigger)", f"{bare * 1000:.0f}", ""))
    rows.append(("hence index maintenance + trigger", f"{indexes * 1000:.0f}",
                 f"{100 * indexes / total:.0f}%"))
    return rows


def single_rows(results: Sequence[SingleResult]) -> list[tuple[str, ...]]:
    return [(r.name, f"{r.median:.0f}", f"{r.p99:.0f}") for r in results]


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(path: Path, host: dict[str, str], jobs: int, repeat: int,
                 runs: Sequence[BulkRun], singles: Sequence[SingleResult], single: int,
                 load: str) -> None:
    median = statistics.median(run.seconds for run in runs)
    text = [
        "# akadze bench enqueue",
        "",
        "Generated by `akadze bench enqueue "
        f"--jobs {jobs} --repeat {repeat} --single {single}`.",
        "",
        "## Host",
        "",
        _md_table(("", ""), [(k, v) for k, v in host.items()] + [("load average at start", load)]),
        "",
        "## Bulk: `enqueue_many_sync` of "
        f"{jobs:,} jobs in one call, committed",
        "",
        f"**Median: {_rate(jobs, median)} jobs/s** ({median * 1000:.0f} ms per call, "
        f"{repeat} runs on an emptied table).",
        "",
        _md_table(("run", "ms", "jobs/s"), bulk_rows(jobs, runs)),
        "",
        "### Where the time goes (median per step, steps run one after another)",
        "",
        _md_table(("step", "ms", "share"), step_rows(runs)),
        "",
        "In `enqueue_many` itself the steps overlap: the id reservation is pipelined ahead of",
        "the validation (the server draws ids while Python validates), and each COPY chunk",
        "is serialized and formatted while the server ingests the previous one. The call",
        "therefore takes less than the sum of the steps.",
        "",
        f"## Single enqueue ({single} calls each, microseconds)",
        "",
        _md_table(("path", "median µs", "p99 µs"), single_rows(singles)),
        "",
    ]
    path.write_text("\n".join(text), encoding="utf-8")


@click.command("enqueue")
@click.option("--jobs", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True,
              help="Jobs per enqueue_many call.")
@click.option("--repeat", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Bulk runs (the median is reported).")
@click.option("--single", type=click.IntRange(1, 1_000_000), default=2_000, show_default=True,
              help="Calls per single-enqueue measurement.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@database_url_option
def command(jobs: int, repeat: int, single: int, report: Path | None,
            database_url: str | None) -> None:
    """Time enqueue_many (with a breakdown) and single enqueues."""
    url = resolve(database_url)
    click.echo(f"benching on {describe(url)}")
    load = " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
    items = _items(jobs)
    with scratch_database(url, False) as scratch, connect(scratch, autocommit=False) as conn:
        host = host_details(conn)
        conn.commit()
        task = _task(scratch)
        runs = [bulk_run(conn, task, items) for _ in range(repeat)]
        singles = single_runs(conn, scratch, task, single)
    print_table(f"enqueue_many of {jobs} jobs", ("run", "ms", "jobs/s"), bulk_rows(jobs, runs))
    print_table("steps (median)", ("step", "ms", "share"), step_rows(runs))
    print_table("single enqueue", ("path", "median µs", "p99 µs"), single_rows(singles))
    if report is not None:
        write_report(report, host, jobs, repeat, runs, singles, single, load)
        click.echo(f"report written to {report}")
