"""``akadze bench claims``: the claim's speed per queue shape, and a load test.

Speed (claim_scenarios.py): each scenario is built at ``--jobs`` ready jobs in
one queue; per claim order, the full-ranking reference claim (``claim_oracle``)
and the windowed ``claim`` each claim 20 slots ``--repeat`` times; medians side
by side, in one run, and both must return the same jobs. Load (claim_load.py):
concurrent claimer processes under tight limits, checked for any moment over a
limit.

The bench runs in a scratch database it creates (and drops) on the given server,
unless ``--in-place`` names a database it may empty.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from ..migrate import migrate_connection
from .claim_load import LoadResult, run_load
from .claim_scenarios import (
    SCENARIO_NAMES,
    SCENARIOS,
    SLOTS,
    Scenario,
    Timing,
    build,
    measure,
    stale_tables,
)
from .pgbouncer import PgBouncer

Conn = psycopg.Connection[Any]


# -- scratch database -------------------------------------------------------------------


@contextmanager
def scratch_database(url: str, in_place: bool) -> Iterator[str]:
    """A migrated database to bench in: a new one on the server of ``url`` (dropped
    afterwards), or ``url`` itself with ``in_place``."""
    if in_place:
        with connect(url) as conn:
            migrate_connection(conn)
        yield url
        return
    name = f"akadze_bench_{uuid.uuid4().hex[:10]}"
    with connect(url) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    scratch = make_conninfo(url, dbname=name)
    try:
        with connect(scratch) as conn:
            migrate_connection(conn)
        yield scratch
    finally:
        with connect(url) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


# -- report -----------------------------------------------------------------------------


def host_details(conn: Conn) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    row = conn.execute("SHOW server_version").fetchone()
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "RAM": ram,
        "PostgreSQL": str(row[0]) if row else "?",
        "Python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load average at start (1/5/15 min)": _loadavg(),
    }


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _fmt_ms(value: float) -> str:
    if value != value:  # NaN: not measured
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def speed_rows(timings: Sequence[Timing], *, titles: bool = True) -> list[tuple[str, ...]]:
    return [
        (t.scenario.title if titles else t.scenario.name, t.order,
         f"{t.jobs:,}".replace(",", " "),
         _fmt_ms(t.oracle) + ("" if len(t.oracle_ms) == len(t.claim_ms)
                              else f" (n={len(t.oracle_ms)})"),
         _fmt_ms(t.windowed), "-" if t.ratio != t.ratio else f"{t.ratio:.1f}x",
         _fmt_ms(t.plain), str(t.claimed), "-" if not t.oracle_ms else "yes" if t.same else "NO")
        for t in timings
    ]


SPEED_COLUMNS = ("queue", "order", "ready jobs", "full ranking ms", "windowed ms", "ratio",
                 "plain SKIP LOCKED ms", "claimed", "same jobs")
SHORT_COLUMNS = ("scenario", "order", "jobs", "ranking", "windowed", "ratio", "plain", "got",
                 "same")
LOAD_COLUMNS = ("order", "claimed", "completed", "claimed twice", "errors", "elapsed s",
                "samples", "samples over a limit", "trigger violations")


STALE_COLUMNS = ("queue", "order", "ready jobs", "fresh ms", "stale ms", "stale / fresh",
                 "plain SKIP LOCKED ms (fresh)", "claimed", "same jobs")
STALE_SHORT = ("scenario", "order", "jobs", "fresh", "stale", "stale/fresh", "plain", "got",
               "same")


def stale_rows(pairs: Sequence[tuple[Timing, Timing]], *,
               titles: bool = True) -> list[tuple[str, ...]]:
    """One row per cell: the windowed claim on fresh and on stale statistics."""
    rows: list[tuple[str, ...]] = []
    for fresh, stale in pairs:
        ratio = stale.windowed / fresh.windowed if fresh.windowed else float("nan")
        rows.append((
            fresh.scenario.title if titles else fresh.scenario.name, fresh.order,
            f"{fresh.jobs:,}".replace(",", " "), _fmt_ms(fresh.windowed),
            _fmt_ms(stale.windowed), f"{ratio:.2f}x", _fmt_ms(fresh.plain),
            str(stale.claimed), "yes" if stale.same and fresh.same else "NO"))
    return rows


def load_rows(results: Sequence[LoadResult]) -> list[tuple[str, ...]]:
    return [
        (r.order, str(r.claimed), str(r.completed), str(r.claimed_twice), str(len(r.errors)),
         f"{r.elapsed:.1f}", str(r.samples), str(r.sampled_over), str(r.trigger_over))
        for r in results
    ]


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _commit_words(durable: bool) -> str:
    if durable:
        return ("(`synchronous_commit = on`, as a worker with `durable_claims=True` "
                "commits its claims)")
    return ("(`synchronous_commit = off`, as a worker commits its claims by default: "
            "`durable_claims=False`)")


def _stale_part(pairs: Sequence[tuple[Timing, Timing]], drained: bool = False) -> list[str]:
    if not pairs:
        return []
    taken = ("analyzed once a drain had ended (the scenario built, every job of it "
             "finished, the tables analyzed, autovacuum then kept off them), then the "
             "same jobs inserted again (the finished ones stay)" if drained else
             "analyzed while empty (autovacuum kept off them), then the jobs inserted")
    return [
        "",
        "## Fresh and stale statistics",
        "",
        f"Each scenario is built in a database of its own, its tables {taken}, with "
        "no ANALYZE after: "
        "*stale* is the windowed claim then, on a new connection, so that its "
        "generic plans are made on those statistics. Then the same tables are "
        "vacuumed and analyzed: *fresh* is the same claim on them (the full table "
        "above). *Same jobs*: the stale claim returned what the full ranking "
        "returns on the fresh tables.",
        "",
        _md_table(STALE_COLUMNS, stale_rows(pairs)),
    ]


def write_report(path: Path, host: dict[str, str], repeat: int,
                 timings: Sequence[Timing], loads: Sequence[LoadResult],
                 durable: bool = False,
                 stale: Sequence[tuple[Timing, Timing]] = (),
                 drained: bool = False) -> None:
    parts = [
        "# Claim speed (`akadze bench claims`)",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        f"Slots = {SLOTS}; median of {repeat} claims per cell (fewer for the full "
        "ranking where marked n=: it stops repeating after its time budget). "
        "*Full ranking*: "
        "`claim_oracle`, which ranks the whole ready set in one statement. *Windowed*: "
        "`claim`. Both are the public calls, each committing its own transaction "
        f"{_commit_words(durable)}; between claims the claimed rows are restored "
        "(untimed; no VACUUM, which would invalidate the claim's prepared plans). "
        "The full rankings of a cell are timed first, in a pass of their own, then the "
        "windowed claims alternating with the plain ones: a windowed claim timed right "
        "after a full ranking (a read of the whole table) ran on emptied caches, which "
        "no worker's claim does. "
        "*Plain SKIP LOCKED*: the floor, one statement "
        "taking the first 20 ready rows with no limits and no fairness "
        "(`bench_plain_claim`), committed and restored the same way. The seed's bench "
        "rolls claims back instead; psycopg forgets its prepared statements at every "
        "ROLLBACK, so that would time a claim planned from scratch, which no worker "
        "sees.",
        "",
        _md_table(SPEED_COLUMNS, speed_rows(timings)),
        *_stale_part(stale, drained),
        "",
        "Scenarios (N = ready jobs; queue order = run_at order unless said):",
        "",
    ]
    seen: set[str] = set()
    for t in timings:
        if t.scenario.name not in seen:
            seen.add(t.scenario.name)
            parts.append(f"- `{t.scenario.name}` ({t.scenario.title}): "
                         f"{t.scenario.description}.")
    if loads:
        first = loads[0]
        parts += [
            "",
            f"## Load: {first.claimers} claimers, {first.jobs} jobs, up to "
            f"{first.seconds:g} s",
            "",
            "Half the jobs over 20 keys with max_running = 5, half without a key. Each "
            "claimer is a process with its own connection: claim up to 20, hold ~10 ms, "
            "complete with a fenced UPDATE. *Samples over a limit*: one-snapshot samples "
            "from another connection that saw a key over max_running; *trigger "
            "violations*: claim commits after which a key was over (deferred constraint "
            "trigger, serialised: the watch of `akadze/bench/sql/watch.sql`).",
            "",
            _md_table(LOAD_COLUMNS, load_rows(loads)),
        ]
        for r in loads:
            for error in sorted(set(r.errors))[:10]:
                parts.append(f"- {r.order}: `{error}`")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


# -- fresh and stale statistics -----------------------------------------------------------


def _fresh_and_stale(url: str, scenario: Scenario, jobs: int, repeat: int,
                     oracle_budget: float, durable: bool,
                     drained: bool = False) -> list[tuple[Timing, Timing]]:
    """``scenario`` in a scratch database of its own: timed on stale statistics
    (analyzed while empty, or once a drain had ended with ``drained``, then
    filled), then on the same tables analyzed."""
    pairs: list[tuple[Timing, Timing]] = []
    with scratch_database(url, False) as scratch:
        with connect(scratch) as conn:
            stale_tables(conn)
            started = time.monotonic()
            build(conn, scenario, jobs, stale=True, drained=drained)
            kind = "drained" if drained else "stale"
            click.echo(f"built {scenario.name} ({jobs} jobs, {kind} statistics) in "
                       f"{time.monotonic() - started:.1f} s", err=True)
        # A new connection: its generic plans are made on the stale statistics.
        # No full ranking here: its one statement on such statistics can take
        # minutes; the answer is checked against the ranking on the fresh tables.
        with connect(scratch) as conn:
            if not durable:
                conn.execute("SET synchronous_commit = off")
            stale = [measure(conn, scenario, order, jobs, repeat, 0.0, plain=False)
                     for order in scenario.orders]
            conn.execute("VACUUM (ANALYZE) akadze.jobs, akadze.limits")
        with connect(scratch) as conn:
            if not durable:
                conn.execute("SET synchronous_commit = off")
            for was in stale:
                fresh = measure(conn, scenario, was.order, jobs, repeat, oracle_budget)
                if fresh.oracle_ms:
                    # measure's fresh.ids is the windowed claim's; the ranking
                    # agreed with it when fresh.same
                    was.same = was.ids == fresh.ids and fresh.same
                pairs.append((fresh, was))
    return pairs


# -- command ----------------------------------------------------------------------------


def _print(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str) -> None:
    print_table(title, columns, rows)


@click.command("claims")
@click.option("--jobs", "sizes", multiple=True, type=click.IntRange(100, 10_000_000),
              help="Ready jobs per scenario (repeatable: every scenario at each size; "
              "default 100000).")
@click.option("--repeat", type=click.IntRange(1, 1000), default=15, show_default=True,
              help="Claims per cell (the median is reported).")
@click.option("--scenario", "names", multiple=True, type=click.Choice(SCENARIO_NAMES),
              help="Only these scenarios (repeatable; default: all).")
@click.option("--oracle-budget", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Seconds per cell after which the full ranking stops repeating.")
@click.option("--skip-load", is_flag=True, help="Skip the load test.")
@click.option("--load-jobs", type=click.IntRange(100), default=20_000, show_default=True)
@click.option("--load-seconds", type=click.FloatRange(0.5), default=20.0, show_default=True)
@click.option("--claimers", type=click.IntRange(1, 64), default=10, show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@click.option("--durable", is_flag=True,
              help="Commit each timed claim with synchronous_commit = on (a worker with "
              "durable_claims=True); by default off, as a worker commits its claims.")
@click.option("--in-place", is_flag=True,
              help="Bench in the given database itself: EMPTIES its akadze tables.")
@click.option("--stale-stats", is_flag=True,
              help="Also time every cell on tables analyzed while empty, then filled "
              "with no ANALYZE (a burst into a quiet queue), beside the same tables "
              "analyzed; each scenario gets a scratch database of its own.")
@click.option("--drained-stats", is_flag=True,
              help="With --stale-stats: the stale statistics are those autovacuum takes "
              "once a drain has ended (the scenario built, every job finished, the "
              "tables analyzed), then the burst again, instead of those of empty tables.")
@click.option("--pgbouncer", is_flag=True,
              help="The load test's claimers go through a PgBouncer in transaction mode "
              "(no prepared statements), started by the bench on a private port.")
@database_url_option
def command(sizes: tuple[int, ...], repeat: int, names: tuple[str, ...], oracle_budget: float,
            skip_load: bool, load_jobs: int,
            load_seconds: float, claimers: int, report: Path | None, durable: bool,
            in_place: bool, stale_stats: bool, drained_stats: bool, pgbouncer: bool,
            database_url: str | None) -> None:
    """Time the windowed claim against the full ranking, and run the load test."""
    if stale_stats and in_place:
        raise click.UsageError(
            "--stale-stats builds each scenario in a scratch database of its own: "
            "it cannot run --in-place")
    if drained_stats and not stale_stats:
        raise click.UsageError("--drained-stats says which stale statistics: "
                               "it needs --stale-stats")
    url = resolve(database_url)
    chosen = [s for s in SCENARIOS if not names or s.name in names]
    timings: list[Timing] = []
    pairs: list[tuple[Timing, Timing]] = []
    loads: list[LoadResult] = []
    click.echo(f"benching on {describe(url)}" + (" (in place)" if in_place else ""))
    with scratch_database(url, in_place) as scratch, connect(scratch) as conn:
        host = host_details(conn)
        if not durable:  # the timed claims, the full ranking and the floor alike
            conn.execute("SET synchronous_commit = off")
        for jobs in sizes or (100_000,):
            for scenario in chosen:
                if stale_stats:
                    got = _fresh_and_stale(url, scenario, jobs, repeat, oracle_budget,
                                           durable, drained_stats)
                    timings += [fresh for fresh, _ in got]
                    pairs += got
                    continue
                started = time.monotonic()
                build(conn, scenario, jobs)
                click.echo(f"built {scenario.name} ({jobs} jobs) in "
                           f"{time.monotonic() - started:.1f} s", err=True)
                for order in scenario.orders:
                    timings.append(measure(conn, scenario, order, jobs, repeat,
                                           oracle_budget))
        if timings:
            _print(SHORT_COLUMNS, speed_rows(timings, titles=False),
                   f"claim, {SLOTS} slots, median ms")
        if pairs:
            _print(STALE_SHORT, stale_rows(pairs, titles=False),
                   f"claim, {SLOTS} slots, median ms, fresh and "
                   f"{'drained' if drained_stats else 'stale'} statistics")
        if not skip_load:
            with contextlib.ExitStack() as stack:
                claimers_url = None
                if pgbouncer:
                    bouncer = stack.enter_context(PgBouncer(url))
                    claimers_url = bouncer.url(scratch)
                    host["load through"] = "PgBouncer, transaction mode"
                for order in ("default", "fair"):
                    loads.append(run_load(scratch, order, jobs=load_jobs, claimers=claimers,
                                          seconds=load_seconds, claimers_url=claimers_url))
            _print(LOAD_COLUMNS, load_rows(loads), "load test")
            for r in loads:
                for error in sorted(set(r.errors))[:5]:
                    click.echo(f"{r.order}: {error}", err=True)
    if report is not None:
        write_report(report, host, repeat, timings, loads, durable, pairs, drained_stats)
        click.echo(f"report written to {report}")
