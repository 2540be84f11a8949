"""``akadze bench limits-busy``: whether limits keep their slots busy.

Three scenarios, each in a fresh scratch database, with workers that poll every
``--poll`` seconds (1 s, the default of a worker), so what is measured is how soon
a key's room is used, not how often the worker polls:

- ``one key``: ``--jobs`` jobs (20) of ``--seconds`` (0.2 s) on one key with
  ``max_running = 2``, one worker with 10 slots in this process. Reported: the
  drain time (the ideal is jobs / 2 x seconds: 2.0 s).
- ``many keys``: ``--keys`` keys (200) with ``max_running = 2``, ``--per-key`` jobs
  (50) of ``--key-seconds`` (50 ms) each, interleaved, run by ``--processes`` (2)
  worker processes with ``--slots`` (200) slots each. Reported: each key's use of
  its limit (the time its functions ran over 2 x its span from first start to last
  end), the mean and the lowest over the keys. Before each burst the jobs table gets
  the statistics autovacuum leaves between two bursts, taken once a drain ended
  (``--no-drained-stats``: those of the scratch table as they are).
- ``start rate``: ``--rate-jobs`` (60) no-op jobs on one key with ``max_starts =
  10`` per second, one worker with 20 slots. Reported: starts per second from the
  first start to the last (10 is the most the limit allows).

Every task returns its own start and end (wall clock): the figures are the tasks'.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import click

from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from ..limits import set_limit_sync
from . import queries
from .claims import host_details, scratch_database
from .hostcpu import at_most, postmaster_of, server_seconds
from .limits_worker import TASK, child, one, run_until_done


def _insert(url: str, *, count: int, keys: int, prefix: str, seconds: float) -> None:
    with connect(url) as conn:
        conn.execute(queries.get("limits_busy_insert"), {
            "task": TASK, "count": count, "keys": keys, "prefix": prefix, "seconds": seconds})


def _reset(url: str) -> None:
    with connect(url) as conn:
        conn.execute(queries.get("limits_busy_reset"))


def one_key(url: str, jobs: int, seconds: float, poll: float, hand_off: bool = True) -> float:
    """Seconds to drain ``jobs`` jobs of one key with max_running 2, 10 slots."""
    _reset(url)
    with connect(url) as conn:
        set_limit_sync(conn, "one0", max_running=2)
    _insert(url, count=jobs, keys=1, prefix="one", seconds=seconds)
    began = time.perf_counter()
    asyncio.run(run_until_done(url, 10, poll, jobs, hand_off))
    took = time.perf_counter() - began
    with connect(url) as conn:
        drain = one(conn, "limits_busy_drain")[0]
    return float(drain) if drain is not None else took


@dataclass
class KeysUse:
    mean: float
    lowest: float
    keys: int
    seconds: float
    jobs: int = 0
    #: CPU seconds over the run, of the worker processes (once their workers
    #: started: not building the app, not the worker's start) and of the server
    #: (None when it is not a process of this host).
    workers_cpu: float | None = None
    server_cpu: float | None = None
    #: Starts a second with every key at its max_running all the time.
    at_limit: float = 0.0

    def per_job(self) -> str:
        """The CPU of a job, workers and server, and how many jobs a second the
        host could run at that cost."""
        if not self.jobs or self.workers_cpu is None or self.server_cpu is None:
            return "CPU not measured (the server is not a process of this host)"
        cores, most = at_most((self.workers_cpu + self.server_cpu) / self.jobs)
        share = f", {most / self.at_limit:.0%} of the {self.at_limit:,.0f} the limits allow" \
            if self.at_limit else ""
        return (f"CPU a job: workers {self.workers_cpu / self.jobs * 1e6:.0f} us, server "
                f"{self.server_cpu / self.jobs * 1e6:.0f} us; {cores} cores run at most "
                f"{most:,.0f} jobs/s at that cost{share}")


def many_keys(url: str, keys: int, per_key: int, seconds: float, processes: int,
              slots: int, poll: float, hand_off: bool = True,
              drained: bool = True) -> KeysUse:
    _reset(url)
    total = keys * per_key
    with connect(url) as conn:
        for number in range(keys):
            set_limit_sync(conn, f"k{number}", max_running=2)
        if drained:
            # The statistics autovacuum leaves between two bursts: taken once the
            # last drain ended (every job finished, none running).
            conn.execute(queries.get("limits_busy_drained"), {
                "task": TASK, "count": total, "keys": keys, "prefix": "k",
                "seconds": seconds})
            conn.execute(queries.get("limits_busy_analyze"))
            conn.execute(queries.get("limits_busy_prune"))
    spawn = multiprocessing.get_context("spawn")
    cpu = spawn.Queue()
    workers = [spawn.Process(target=child, args=(url, slots, poll, total, hand_off, cpu))
               for _ in range(processes)]
    for process in workers:
        process.start()
    try:
        with connect(url) as conn:  # wait until every worker has its row
            deadline = time.monotonic() + 60
            while conn.execute("SELECT count(*) FROM akadze.workers").fetchone() != (processes,):
                if time.monotonic() > deadline:
                    raise click.ClickException("the worker processes did not start")
                time.sleep(0.05)
            postmaster = postmaster_of(conn)
        time.sleep(0.5)  # their LISTEN connections too
        server_before = None if postmaster is None else server_seconds(postmaster)
        _insert(url, count=total, keys=keys, prefix="k", seconds=seconds)
        for process in workers:
            process.join(timeout=max(120.0, total * seconds))
        # the workers' backends have ended: the postmaster has reaped their time
        server_after = None if postmaster is None else server_seconds(postmaster, 0.1)
    finally:
        for process in workers:
            if process.is_alive():
                process.kill()
    if any(process.exitcode != 0 for process in workers):
        raise click.ClickException("a worker process failed")
    spent = [cpu.get(timeout=10) for _ in workers]
    with connect(url) as conn:
        mean, lowest, counted = one(conn, "limits_busy_use")
        drain = one(conn, "limits_busy_drain")[0]
    server = (server_after - server_before
              if server_before is not None and server_after is not None else None)
    return KeysUse(float(mean), float(lowest), int(counted), float(drain), total,
                   sum(spent), server, keys * 2 / seconds if seconds > 0 else 0.0)


@dataclass
class Rate:
    per_second: float
    starts: int
    seconds: float
    #: The same from the limit's start marks (the claims' clock): what the limit
    #: counts, never above 10. The tasks' own figure can be, by a little: the
    #: first start of the first window runs later after its claim than the others
    #: do (the worker's first claim), which shortens the span.
    by_marks: float


def _rate(starts: list[float]) -> float:
    # The last window's starts are at its beginning: count the windows from the
    # first start to the last, plus the one the last starts open.
    span = starts[-1] - starts[0]
    return (len(starts) - 10) / span if span > 0 else float("inf")


def start_rate(url: str, jobs: int, poll: float, hand_off: bool = True) -> Rate:
    _reset(url)
    with connect(url) as conn:
        set_limit_sync(conn, "rate0", max_starts=10, window=timedelta(seconds=1))
    _insert(url, count=jobs, keys=1, prefix="rate", seconds=0.0)
    asyncio.run(run_until_done(url, 20, poll, jobs, hand_off))
    with connect(url) as conn:
        starts = [float(str(row[0])) for row in conn.execute(queries.get("limits_busy_starts"))]
        marks = [float(str(row[0])) for row in conn.execute(queries.get("limits_busy_marks"))]
    return Rate(_rate(starts), len(starts), starts[-1] - starts[0], _rate(marks))


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def write_report(path: Path, host: dict[str, str], rows: list[tuple[str, ...]],
                 runs: int, poll: float, notes: Sequence[str] = ()) -> None:
    lines = [
        "# Limits that keep their slots busy",
        "",
        "Measured with `akadze bench limits-busy` (see its `--help` for the scenarios); "
        f"workers poll every {poll:g} s, so the figures show how soon a key's room is "
        f"used, not the poll. Medians of {runs} run(s).",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        "| scenario | figure | target | runs |",
        "|---|---:|---:|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    if notes:
        lines += ["What the runs cost the host's CPU (the worker processes from their "
                  "workers' start, the server's processes from the burst to the end):",
                  "", *notes, ""]
    path.write_text("\n".join(lines))


@click.command("limits-busy")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True,
              help="Runs of each scenario (the report gives medians).")
@click.option("--jobs", type=click.IntRange(1), default=20, show_default=True,
              help="One key: jobs on the key (max_running 2, 10 slots).")
@click.option("--seconds", type=click.FloatRange(0), default=0.2, show_default=True,
              help="One key: seconds each job runs.")
@click.option("--keys", type=click.IntRange(1), default=200, show_default=True,
              help="Many keys: keys with max_running 2.")
@click.option("--per-key", type=click.IntRange(1), default=50, show_default=True,
              help="Many keys: jobs per key.")
@click.option("--key-seconds", type=click.FloatRange(0), default=0.05, show_default=True,
              help="Many keys: seconds each job runs.")
@click.option("--processes", type=click.IntRange(1), default=2, show_default=True,
              help="Many keys: worker processes.")
@click.option("--slots", type=click.IntRange(1), default=200, show_default=True,
              help="Many keys: slots of each worker process.")
@click.option("--rate-jobs", type=click.IntRange(11), default=60, show_default=True,
              help="Start rate: jobs on the key with max_starts 10 per second.")
@click.option("--poll", type=click.FloatRange(0.01), default=1.0, show_default=True,
              help="The workers' poll_interval in seconds.")
@click.option("--only", type=click.Choice(["one-key", "many-keys", "start-rate"]),
              multiple=True, help="Run only these scenarios (repeatable).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@click.option("--hand-off/--no-hand-off", default=True, show_default=True,
              help="Whether the workers hand a limited key's freed slot to its next job.")
@click.option("--drained-stats/--no-drained-stats", default=True, show_default=True,
              help="Many keys: give the jobs table, before each burst, the statistics "
                   "autovacuum takes once a drain has ended (every job finished, none "
                   "running); --no-drained-stats leaves the scratch table's as they are.")
@database_url_option
def command(runs: int, jobs: int, seconds: float, keys: int, per_key: int,
            key_seconds: float, processes: int, slots: int, rate_jobs: int, poll: float,
            only: tuple[str, ...], report: Path | None, hand_off: bool,
            drained_stats: bool, database_url: str | None) -> None:
    """Whether a key at its limit uses its room as soon as it has some."""
    url = resolve(database_url)
    chosen = set(only or ("one-key", "many-keys", "start-rate"))
    click.echo(f"benching on {describe(url)}")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    with scratch_database(url, False) as scratch:
        with connect(scratch) as conn:
            host = host_details(conn)
        if "one-key" in chosen:
            drains = [one_key(scratch, jobs, seconds, poll, hand_off) for _ in range(runs)]
            click.echo("one key: " + ", ".join(f"{d:.2f} s" for d in drains))
            rows.append((f"one key: {jobs} jobs of {seconds:g} s, max_running 2, 10 slots",
                         f"{_median(drains):.2f} s drain", "<= 2.3 s",
                         ", ".join(f"{d:.2f}" for d in drains)))
        if "many-keys" in chosen:
            uses = [many_keys(scratch, keys, per_key, key_seconds, processes, slots, poll,
                              hand_off, drained_stats) for _ in range(runs)]
            for use in uses:
                click.echo(f"many keys: mean use {use.mean:.1%}, lowest {use.lowest:.1%}, "
                           f"{use.keys} keys, drained in {use.seconds:.2f} s; "
                           f"{use.per_job()}")
            notes.extend(f"- many keys, run {number}: {use.per_job()}."
                         for number, use in enumerate(uses, 1))
            rows.append((f"many keys: {keys} keys x {per_key} jobs of {key_seconds:g} s, "
                         f"max_running 2, {processes} processes x {slots} slots"
                         + (", statistics of a drained table" if drained_stats else ""),
                         f"{_median([u.mean for u in uses]):.1%} mean use "
                         f"(lowest key {_median([u.lowest for u in uses]):.1%})",
                         ">= 90%",
                         ", ".join(f"{u.mean:.1%}/{u.lowest:.1%}/{u.seconds:.2f} s"
                                   for u in uses)))
        if "start-rate" in chosen:
            rates = [start_rate(scratch, rate_jobs, poll, hand_off) for _ in range(runs)]
            click.echo("start rate: " + ", ".join(
                f"{r.per_second:.3f}/s (marks {r.by_marks:.3f}/s)" for r in rates))
            rows.append((f"start rate: {rate_jobs} jobs, max_starts 10 per 1 s, 20 slots",
                         f"{_median([r.per_second for r in rates]):.3f} starts/s "
                         f"(by the limit's marks {_median([r.by_marks for r in rates]):.3f})",
                         ">= 10",
                         ", ".join(f"{r.per_second:.3f}/{r.by_marks:.3f}" for r in rates)))
    print_table("limits kept busy", ["scenario", "figure", "target", "runs"], rows)
    if report is not None:
        write_report(report, host, rows, runs, poll, notes)
        click.echo(f"report written to {report}")
