"""``akadze bench cluster``: one queue, N claimer processes, an injected network.

Many hosts share one PostgreSQL; what limits one queue is how long each claim holds
the queue's turn, and that is counted in network round trips. This bench puts a
latency-injecting proxy (:mod:`akadze.bench.proxy`, started here on 127.0.0.1) between
N claimer processes (:mod:`akadze.bench.cluster_claimers`) and the server, and for
every injected round trip, number of claimers and mode measures, side by side in one
run (the modes alternate within each setting, ``--rounds`` repeats the whole matrix
and the report gives medians):

- per-queue claims/s and jobs/s over the cell's window (up to ``--seconds``, or until
  the queue runs dry);
- the time claimers spend waiting for the queue's turn (the claim's advisory lock),
  sampled in ``pg_stat_activity``, as a share of their time and in ms per claim;
- the CPU of the claimers' server backends and of the proxy itself (``/proc``).

Modes: ``plain`` (the uncoordinated ``FOR UPDATE SKIP LOCKED`` floor: no limits, no
turn), ``fifo`` (``claim``, queue order, no limits) and ``fair`` (``claim(fair=True)``,
half the jobs over 20 keys with max_running = 5). Each cell gets a fresh queue of
``--jobs`` ready jobs in a scratch database.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psycopg

from ..cli.options import database_url_option, print_table, resolve
from ..database import connect, describe
from . import queries
from .claim_scenarios import BASE
from .claims import host_details, scratch_database
from .cluster_claimers import MODES, ClaimerPool, ClaimerResult, Sampler
from .proxy import Proxy

Conn = psycopg.Connection[Any]

QUEUE = "cluster"
SLOTS = 20


@dataclass
class Cell:
    """One measurement: ``claimers`` processes, one ``mode``, ``rtt`` ms injected."""

    mode: str
    claimers: int
    rtt: float
    measured_rtt: float = float("nan")  # ms added by the proxy over its own 0 ms
    seconds: float = 0.0
    claims: int = 0
    jobs: int = 0
    claim_ms: float = float("nan")  # median, client side
    turn_share: float = float("nan")  # of the claimers' time, waiting for the turn
    server_cpu: float = float("nan")  # cores
    proxy_cpu: float = float("nan")  # cores
    dry: bool = False
    twice: int = 0  # jobs claimed more than once (none should be)
    errors: list[str] = field(default_factory=list)

    @property
    def claims_per_s(self) -> float:
        return self.claims / self.seconds if self.seconds else 0.0

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def turn_ms_per_claim(self) -> float:
        if not self.claims:
            return float("nan")
        return self.turn_share * self.claimers * self.seconds / self.claims * 1000


def build_queue(conn: Conn, mode: str, jobs: int) -> None:
    """A fresh queue: no keys (plain, fifo), or the load test's shape (fair)."""
    conn.execute(queries.get("bench_reset"))
    if mode == "fair":
        conn.execute(queries.get("bench_insert_limits"),
                     {"prefix": "k", "keys": 20, "max_running": 5})
        conn.execute(queries.get("bench_insert_load"),
                     {"queue": QUEUE, "base": BASE, "jobs": jobs, "keys": 20})
    else:
        conn.execute(queries.get("bench_insert_ready"), {
            "queue": QUEUE, "priority": 0, "base": BASE, "start": 0, "stop": jobs,
            "keys": 0, "prefix": "k", "block": 1})
    conn.execute("VACUUM (ANALYZE) akadze.jobs, akadze.limits")


def round_trip_ms(url: str, n: int = 40) -> float:
    """The fastest of ``n`` ``SELECT 1`` round trips on a new connection to ``url``, in
    ms (the fastest, not the median: a busy machine only ever adds time, so the
    difference of two minimums is the best estimate of what the proxy adds)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        times = []
        for _ in range(n):
            began = time.perf_counter()
            conn.execute("SELECT 1")
            times.append(time.perf_counter() - began)
    return min(times) * 1000


def measure(conn: Conn, scratch: str, proxy: Proxy, pool: ClaimerPool, cell: Cell,
            jobs: int, seconds: float) -> Cell:
    build_queue(conn, cell.mode, jobs)
    # What the proxy adds at this setting over its own hop, measured now (the
    # machine's load moves both alike).
    proxy.set_delay(0)
    base_rtt = round_trip_ms(proxy.url(scratch), n=30)
    proxy.set_delay(cell.rtt / 2000)
    cell.measured_rtt = round_trip_ms(proxy.url(scratch), n=30) - base_rtt
    pids = pool.connect(cell.claimers, proxy.url(scratch), cell.mode, QUEUE, SLOTS)
    start_at = time.monotonic() + 0.1
    end_at = start_at + seconds
    with Sampler(scratch, pids, proxy.pid, interval=0.02) as sampler:
        results = pool.run(cell.claimers, start_at, end_at)
    _settle(cell, results, sampler, start_at, end_at)
    row = conn.execute(queries.get("bench_load_progress"), {"queue": QUEUE}).fetchone()
    cell.twice = int(row[2]) if row else 0
    return cell


def _settle(cell: Cell, results: Sequence[ClaimerResult], sampler: Sampler,
            start_at: float, end_at: float) -> None:
    # The window: from the agreed start to the end of the last claim (each claimer
    # starts its last claim before end_at, so a slow claim still counts), or to the
    # first claim that found the queue dry.
    dry = [r.dry_at for r in results if r.dry_at is not None]
    ends = [ended for r in results for ended, _, _ in r.claims]
    end = min(dry) if dry else max([end_at, *ends])
    cell.dry = bool(dry)
    cell.seconds = max(end - start_at, 1e-9)
    durations: list[float] = []
    for r in results:
        cell.errors.extend(r.errors)
        for ended, jobs, took in r.claims:
            if ended <= end:
                cell.claims += 1
                cell.jobs += jobs
                durations.append(took)
    if durations:
        cell.claim_ms = statistics.median(durations) * 1000
    samples = sampler.samples
    if samples.looks:
        cell.turn_share = samples.waiting / (samples.looks * cell.claimers)
    span, server, proxied = samples.cpu_between(start_at, end)
    if span > 0:
        cell.server_cpu = server / span
        cell.proxy_cpu = proxied / span


# -- the medians and the report ---------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    kept = [v for v in values if v == v]
    return statistics.median(kept) if kept else float("nan")


def median_cells(cells: Sequence[Cell]) -> list[Cell]:
    """One cell per (claimers, rtt, mode), each figure the median over the rounds."""
    groups: dict[tuple[int, float, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.claimers, c.rtt, c.mode), []).append(c)
    merged: list[Cell] = []
    for (claimers, rtt, mode), group in groups.items():
        m = Cell(mode, claimers, rtt)
        m.seconds = 1000.0  # the medians below are per second, kept to 1/1000
        m.claims = round(1000 * _median([c.claims_per_s for c in group]))
        m.jobs = round(1000 * _median([c.jobs_per_s for c in group]))
        m.measured_rtt = _median([c.measured_rtt for c in group])
        m.claim_ms = _median([c.claim_ms for c in group])
        m.turn_share = _median([c.turn_share for c in group])
        m.server_cpu = _median([c.server_cpu for c in group])
        m.proxy_cpu = _median([c.proxy_cpu for c in group])
        m.dry = any(c.dry for c in group)
        m.twice = sum(c.twice for c in group)
        m.errors = [e for c in group for e in c.errors]
        merged.append(m)
    return merged


def _f(value: float, digits: int = 2) -> str:
    return "-" if value != value else f"{value:.{digits}f}"


COLUMNS = ("claimers", "RTT ms", "measured +ms", "mode", "claims/s", "jobs/s",
           "claim ms", "turn wait %", "turn wait ms/claim", "server CPU %", "proxy CPU %",
           "vs 0 RTT", "claimed twice", "errors")


def rows(cells: Sequence[Cell]) -> list[tuple[str, ...]]:
    at_zero = {(c.claimers, c.mode): c.jobs_per_s for c in cells if c.rtt == 0}
    out: list[tuple[str, ...]] = []
    for c in sorted(cells, key=lambda c: (c.claimers, c.rtt, MODES.index(c.mode))):
        zero = at_zero.get((c.claimers, c.mode))
        ratio = f"{c.jobs_per_s / zero:.2f}x" if zero else "-"
        out.append((
            str(c.claimers), f"{c.rtt:g}", _f(c.measured_rtt), c.mode,
            f"{c.claims_per_s:.1f}" if c.claims_per_s < 100 else f"{c.claims_per_s:.0f}",
            f"{c.jobs_per_s:.0f}" + (" (dry)" if c.dry else ""),
            _f(c.claim_ms), _f(100 * c.turn_share, 0) if c.mode != "plain" else "-",
            _f(c.turn_ms_per_claim) if c.mode != "plain" else "-",
            _f(100 * c.server_cpu, 0), _f(100 * c.proxy_cpu, 0), ratio,
            str(c.twice), str(len(c.errors)),
        ))
    return out


def write_report(path: Path, host: dict[str, str], load: str, options: dict[str, Any],
                 cells: Sequence[Cell]) -> None:
    md = [
        "# Cluster bench: one queue, N claimer processes, an injected network",
        "",
        "Written by `akadze bench cluster " + options["argv"] + "`.",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + f"; load average {load}.",
        "",
        f"Each cell: a fresh queue of {options['jobs']} ready jobs in a scratch database; "
        f"N claimer processes, each with one connection through the bench's TCP proxy "
        f"(`akadze.bench.proxy`, a process of its own on 127.0.0.1) that adds half the "
        f"injected round trip in each direction; each claims up to {SLOTS} and completes "
        f"them at once with a fenced UPDATE on the same connection (one round trip "
        f"outside the turn); claims start for {options['seconds']:g} s (the window ends "
        f"with the last of them) or until the queue is dry (marked). Medians of "
        f"{options['rounds']} round(s); within a setting the modes run one after the "
        "other, alternating, so they share the machine's moment.",
        "",
        "- *plain*: the uncoordinated floor, one `FOR UPDATE SKIP LOCKED` statement "
        "(`cluster_plain_claim`): no limits, no fair turns, no queue turn. *fifo*: "
        "`claim()` in queue order. *fair*: `claim(fair=True)`, half the jobs over 20 keys "
        "with max_running = 5, half without a key.",
        "- *measured +ms*: the `SELECT 1` round trip through the proxy at this setting "
        "minus the same at 0 injected, just before the cell (the fastest of 30 each).",
        "- *claim ms*: median time of one claim call, client side.",
        "- *turn wait*: samples of `pg_stat_activity` every 20 ms from another connection: "
        "the share of the claimers' backends waiting for an advisory lock (the claim's "
        "turn, the only one they take); per claim = share x N x seconds / claims.",
        "- *server CPU*: user + system CPU of the claimers' own backends (`/proc`), in % of "
        "one core; the checkpointer, WAL writer and the sampler's backend are not counted. "
        "*proxy CPU*: the proxy process, % of one core.",
        "- *vs 0 RTT*: jobs/s over the same mode and N at 0 ms injected. *claimed twice*: "
        "jobs of the cell's queue with run_count > 1 afterwards (summed over rounds; "
        "must be 0).",
        "",
        _md_table(COLUMNS, rows(cells)),
        "",
    ]
    errors = sorted({e for c in cells for e in c.errors})
    if errors:
        md += ["Errors seen:", ""] + [f"- `{e}`" for e in errors[:20]] + [""]
    path.write_text("\n".join(md), encoding="utf-8")


def _md_table(columns: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _numbers(kind: type, text: str, name: str) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers",
                                 param_hint=name) from None
    if not values or any(v < 0 for v in values):
        raise click.BadParameter(f"{text!r}: give one or more non-negative numbers",
                                 param_hint=name)
    return values


@click.command("cluster")
@click.option("--claimers", "claimers_text", default="1,2,4,8,16", show_default=True,
              help="Claimer processes per cell, comma-separated.")
@click.option("--rtts", "rtts_text", default="0,0.2,0.5,2", show_default=True,
              help="Injected round trips in ms, comma-separated.")
@click.option("--modes", "modes_text", default=",".join(MODES), show_default=True,
              help="Which of plain, fifo, fair, comma-separated.")
@click.option("--seconds", type=click.FloatRange(0.1, 600), default=3.0, show_default=True,
              help="Longest window per cell.")
@click.option("--jobs", type=click.IntRange(100, 10_000_000), default=40_000,
              show_default=True, help="Ready jobs per cell.")
@click.option("--rounds", type=click.IntRange(1, 50), default=1, show_default=True,
              help="Times the whole matrix runs (the report gives medians).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@database_url_option
def command(claimers_text: str, rtts_text: str, modes_text: str, seconds: float, jobs: int,
            rounds: int, report: Path | None, database_url: str | None) -> None:
    """Claims of one queue by N processes through an injected network round trip."""
    counts = _numbers(int, claimers_text, "--claimers")
    if any(n < 1 or n > 64 for n in counts):
        raise click.BadParameter("claimers must be 1 to 64", param_hint="--claimers")
    rtts = _numbers(float, rtts_text, "--rtts")
    if any(r > 100 for r in rtts):
        raise click.BadParameter("round trips must be at most 100 ms", param_hint="--rtts")
    modes = [m.strip() for m in modes_text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise click.BadParameter(f"unknown mode {unknown[0] if unknown else modes_text!r} "
                                 f"(choose from {', '.join(MODES)})", param_hint="--modes")
    url = resolve(database_url)
    click.echo(f"benching on {describe(url)}")
    cells: list[Cell] = []
    with scratch_database(url, False) as scratch, connect(scratch) as conn, \
            Proxy.for_url(scratch) as proxy:
        host = host_details(conn)
        pool = ClaimerPool(max(counts))
        try:
            for round_number in range(rounds):
                for n in counts:
                    for rtt in rtts:
                        for mode in modes:
                            cell = measure(conn, scratch, proxy, pool, Cell(mode, n, rtt),
                                           jobs, seconds)
                            cells.append(cell)
                            click.echo(f"round {round_number + 1}: {n} x {mode} at {rtt:g} ms:"
                                       f" {cell.jobs_per_s:.0f} jobs/s", err=True)
        finally:
            pool.close()
    merged = median_cells(cells)
    print_table("one queue, N claimers (medians)", COLUMNS, rows(merged))
    if report is not None:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) \
            if Path("/proc/loadavg").exists() else "?"
        argv = (f"--claimers {claimers_text} --rtts {rtts_text} --modes {','.join(modes)} "
                f"--seconds {seconds:g} --jobs {jobs} --rounds {rounds}")
        write_report(report, host, load, {"argv": argv, "jobs": jobs, "seconds": seconds,
                                          "rounds": rounds}, merged)
        click.echo(f"report written to {report}")
