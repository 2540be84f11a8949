"""``akadze bench faults``: the fault scenarios, run against a private server, with a report.

Each scenario (see :mod:`akadze.bench.fault_scenarios`) runs real worker processes
on a scratch database of a private PostgreSQL 16 server started with akadze's
embedded launcher in a temporary directory (never the server others use: the
restart scenario stops and crashes it), injects one kind of fault while the load
runs, waits for every job to finish and audits the promises: nothing lost, limits
never exceeded, complete_tx effects exactly once, no stale finish.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import psycopg

from .fault_scenarios import SCENARIO_NAMES, SCENARIOS, Options, ScenarioResult, run_scenario
from .fault_server import private_server
from .pgbouncer import PgBouncer, find_pgbouncer

COLUMNS = ("scenario", "jobs", "faults", "succeeded", "failed", "retried", "rescued",
           "given back", "lost", "reruns beyond a/l/o", "max running / limit",
           "limit violations", "stale finishes", "effects != 1", "recovery s", "ok")


def _limits(result: ScenarioResult) -> str:
    worst = max(((run, limit) for run, limit in result.max_running.values()),
                key=lambda x: x[0] - x[1], default=None)
    return "-" if worst is None else f"{worst[0]} / {worst[1]}"


def summary_rows(results: Sequence[ScenarioResult]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for r in results:
        a = r.audit
        rows.append((
            r.name, str(r.jobs), str(r.faults), str(a.succeeded),
            str(a.states.get("failed", 0)), str(a.retried), str(a.rescued), str(a.given_back),
            str(r.lost), str(a.rerun_jobs), _limits(r),
            str(a.violations + a.rate_violations + r.over_samples),
            str(a.stale_effects + a.stale_results),
            str(a.tx_wrong_effects + a.effects_of_unfinished),
            "-" if r.recovery is None else f"{r.recovery:.1f}",
            "yes" if r.ok else "NO",
        ))
    return rows


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


PHASE_COLUMNS = ("phase", "seconds", "jobs/s", "probe claim ms (median)", "p95 ms",
                 "dead tuples (end)", "jobs heap KiB", "jobs indexes KiB")


def report_text(host: dict[str, str], options: Options, results: Sequence[ScenarioResult],
                elapsed: float) -> str:
    parts = [
        "## Fault scenarios (`akadze bench faults`)",
        "",
        "Host: " + "; ".join(f"{k} {v}" for k, v in host.items()) + ".",
        "",
        f"Seed {options.seed}; {options.workers} worker processes (`akadze worker`, "
        f"{options.slots} slots, lease {options.lease:g} s, every second one in fair order), "
        "no supervisor; a private PostgreSQL 16 server (akadze's embedded launcher)"
        + (", the workers through a PgBouncer in transaction mode "
           "(`--transaction-pooling`, polling)" if options.worker_args else "")
        + f". Total run time {elapsed:.0f} s.",
        "",
        "Columns: *retried* = attempts spent beyond the first (injected failures, "
        "rescues, errors); *rescued* = runs taken back after a lease expired; *given "
        "back* = runs handed back without spending an attempt (shutdown, self-fencing, "
        "a claim whose reply was lost); *lost* = jobs not finished when the scenario "
        f"gave up ({options.recovery_timeout:g} s after the last fault); *reruns beyond "
        "a/l/o* = jobs that ran more than once for another reason than their injected "
        "failure (at-least-once delivery after a fault; each is explained by a rescue, "
        "a give-back or a recorded error); *max running / limit* = the worst key seen by "
        "the sampler; *limit violations* = commit-time trigger + start-rate windows + "
        "samples over a limit; *stale finishes* = results or complete_tx rows written by "
        "a run that was no longer the job's; *effects != 1* = complete_tx jobs without "
        "exactly one effect row; *recovery* = seconds from the last fault until every "
        "job had finished.",
        "",
        _md_table(COLUMNS, summary_rows(results)),
        "",
    ]
    for r in results:
        a = r.audit
        parts += [f"### {r.name}: {r.title}", ""]
        parts += [f"- {note}" for note in r.notes]
        parts.append(
            f"- {r.jobs} jobs, {a.runs} runs; {a.injected} injected failures, {a.rescued} "
            f"rescues, {a.given_back} give-backs, {a.other_errors} attempts spent on other "
            f"errors, {a.unexplained} jobs with an unexplained attempt")
        parts.append(f"- backlog when the last fault ended: {r.backlog_at_last_fault} jobs; "
                     "recovery " + ("did not finish" if r.recovery is None
                                    else f"{r.recovery:.1f} s") +
                     f" (lease {r.lease:g} s); whole scenario {r.elapsed:.1f} s")
        parts.append("- max running per key (sampled, " + f"{r.samples} samples): " + ", ".join(
            f"{k} {m}/{lim}" for k, (m, lim) in sorted(r.max_running.items())))
        parts.append(f"- worker processes started {r.started_processes}, died unplanned "
                     f"{r.unplanned_deaths}; worker logs: " + (", ".join(
                         f"{k} {n}" for k, n in sorted(r.logs.items())) or "nothing notable"))
        if a.commit_rate_violations != a.rate_violations:
            parts.append(f"- start-rate windows over max_starts: {a.rate_violations} by the "
                         f"claims' clock (started_at), {a.commit_rate_violations} by commit "
                         "time")
        parts += [f"- {detail}" for detail in a.details]
        if a.error_kinds:
            parts.append("- other recorded errors: " + "; ".join(
                f"{n}x {kind}: {msg}" for kind, msg, n in a.error_kinds))
        if r.phases:
            parts += ["", _md_table(PHASE_COLUMNS, r.phases)]
        if r.intervals:
            series = " ".join(str(n) for _, n in r.intervals)
            parts.append(f"- jobs finished per second: {series}")
        parts.append("")
    return "\n".join(parts) + "\n"


def run_all(names: Sequence[str], options: Options, say: Any = None, *,
            pgbouncer: bool = False) -> tuple[dict[str, str], list[ScenarioResult], float]:
    chosen = [s for s in SCENARIOS if not names or s.name in names]
    results = []
    began = time.monotonic()
    echo = say or (lambda m: click.echo(m, err=True))
    from .claims import host_details  # imports the CLI, which imports this module

    with private_server() as server, contextlib.ExitStack() as stack:
        with psycopg.connect(server.admin_url(), autocommit=True) as conn:
            host = host_details(conn)
        if pgbouncer:
            # The workers go through a PgBouncer of the bench's own in transaction
            # mode; the monitor, the audit and the faults talk to the server directly.
            bouncer = stack.enter_context(PgBouncer(server.admin_url(), pool_size=40))
            options = replace(options, worker_url=bouncer.url,
                              worker_args=("--transaction-pooling",))
            host["PgBouncer"] = f"{_version()}, transaction mode"
        for scenario in chosen:
            echo(f"scenario {scenario.name} (seed {options.seed}) ...")
            results.append(run_scenario(scenario, options, server, say=echo))
    return host, results, time.monotonic() - began


def _version() -> str:
    binary = find_pgbouncer()
    if binary is None:
        return "?"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    first = out.stdout.strip().splitlines()[:1]
    return first[0] if first else "?"


@click.command("faults")
@click.option("--scenario", "names", multiple=True, type=click.Choice(SCENARIO_NAMES),
              help="Only these scenarios (repeatable; default: all).")
@click.option("--seed", type=click.IntRange(0), default=1, show_default=True)
@click.option("--jobs", type=click.IntRange(50, 1_000_000), default=3000, show_default=True)
@click.option("--workers", type=click.IntRange(2, 32), default=4, show_default=True)
@click.option("--slots", type=click.IntRange(1, 100), default=8, show_default=True)
@click.option("--lease", type=click.FloatRange(0.5, 60), default=2.5, show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown report here.")
@click.option("--logs", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the worker logs here (default: a temporary directory).")
@click.option("--pgbouncer", is_flag=True,
              help="Run the workers through a PgBouncer in transaction mode "
              "(--transaction-pooling), started by the bench on a private port.")
def command(names: tuple[str, ...], seed: int, jobs: int, workers: int, slots: int,
            lease: float, report: Path | None, logs: Path | None, pgbouncer: bool) -> None:
    """Run the fault scenarios on a private PostgreSQL server and audit every promise."""
    from ..cli.options import print_table  # the CLI imports this module

    with tempfile.TemporaryDirectory(prefix="akadze-fault-logs-") as tmp:
        logdir = logs or Path(tmp)
        logdir.mkdir(parents=True, exist_ok=True)
        options = Options(jobs=jobs, workers=workers, slots=slots, seed=seed, lease=lease,
                          logdir=logdir)
        if pgbouncer and find_pgbouncer() is None:
            raise click.UsageError("--pgbouncer: pgbouncer is not installed")
        host, results, elapsed = run_all(names, options, pgbouncer=pgbouncer)
    print_table("fault scenarios", COLUMNS, summary_rows(results))
    if report is not None:
        report.write_text(report_text(host, options, results, elapsed), encoding="utf-8")
        click.echo(f"report written to {report}")
    if not all(r.ok for r in results):
        raise click.exceptions.Exit(1)
