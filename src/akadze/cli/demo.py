"""``akadze demo``: watch fair scheduling and exact limits work, then see them checked."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..bench import demo, demo_plan
from ..database import describe
from ..errors import ConfigurationError
from .options import database_url_option, resolve


class _Progress:
    """Renders snapshots: a live table on a terminal, periodic lines otherwise."""

    def __init__(self, plan: demo_plan.Plan, console: Console, plain: bool) -> None:
        self.plan = plan
        self.console = console
        self.plain = plain
        self.history: deque[tuple[float, int]] = deque(maxlen=64)
        self.live: Live | None = None
        self.last_line = -1.0

    def __enter__(self) -> _Progress:
        if not self.plain:
            self.live = Live(console=self.console, refresh_per_second=8, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def rate(self, snapshot: demo_plan.Snapshot) -> float:
        self.history.append((snapshot.elapsed, snapshot.finished))
        recent = [(t, n) for t, n in self.history if t >= snapshot.elapsed - 1.0]
        (t0, n0), (t1, n1) = recent[0], recent[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def __call__(self, snapshot: demo_plan.Snapshot, peaks: demo_plan.Peaks) -> None:
        rate = self.rate(snapshot)
        if self.live is not None:
            self.live.update(self.table(snapshot, rate))
        elif snapshot.elapsed - self.last_line >= 1.0 or snapshot.finished >= self.plan.total:
            self.last_line = snapshot.elapsed
            self.console.print(self.line(snapshot, rate), soft_wrap=True)

    def _in_use(self, tenant: demo_plan.TenantPlan, counts: demo_plan.Counts) -> str:
        if tenant.max_running is not None:
            return f"running {counts.running}/{tenant.max_running}"
        if tenant.max_starts is not None:
            return f"starts {counts.starts_in_window}/{tenant.max_starts} per {tenant.window:g}s"
        return ""

    def table(self, snapshot: demo_plan.Snapshot, rate: float) -> Group:
        table = Table(header_style="bold", title_justify="left")
        for column in ("tenant", "jobs", "done", "running", "queued", "retrying", "limit in use"):
            table.add_column(column, justify="left" if column in ("tenant", "limit in use")
                             else "right")
        for tenant in self.plan.tenants:
            counts = snapshot.tenants[tenant.name]
            table.add_row(tenant.name, str(tenant.jobs + tenant.urgent), str(counts.succeeded),
                          str(counts.running), str(counts.queued - counts.retrying),
                          str(counts.retrying), self._in_use(tenant, counts))
        head = Text.assemble(
            (f"{snapshot.elapsed:5.1f}s ", "bold"),
            f"{snapshot.finished}/{self.plan.total} jobs done, {rate:.0f} jobs/s, "
            f"{self.plan.slots} slots, fair claim" + self._urgent(snapshot, ", "),
        )
        return Group(head, table)

    @staticmethod
    def _urgent(snapshot: demo_plan.Snapshot, lead: str) -> str:
        """The urgent batch's progress, once it has arrived."""
        sent = sum(c.urgent for c in snapshot.tenants.values())
        done = sum(c.urgent_succeeded for c in snapshot.tenants.values())
        return f"{lead}urgent batch {done}/{sent} done" if sent else ""

    def line(self, snapshot: demo_plan.Snapshot, rate: float) -> str:
        parts = []
        for tenant in self.plan.tenants:
            c = snapshot.tenants[tenant.name]
            extra = self._in_use(tenant, c)
            parts.append(
                f"{tenant.name} {c.succeeded} done {c.running} run "
                f"{c.queued - c.retrying} queued {c.retrying} retrying"
                + (f" ({extra})" if extra else "")
            )
        return (f"{snapshot.elapsed:5.1f}s {snapshot.finished}/{self.plan.total} done "
                f"{rate:4.0f} jobs/s | " + " | ".join(parts) + self._urgent(snapshot, " | "))


def _summary(result: demo_plan.Result, console: Console) -> None:
    table = Table(title="Tenants", header_style="bold", title_justify="left",
                  caption="* while every tenant still had work waiting", caption_justify="left")
    for column in ("tenant", "limit", "jobs", "backlog", "starts*", "share*", "peak"):
        table.add_column(column, justify="left" if column in ("tenant", "limit") else "right")
    for t in result.tenants:
        plan = next(p for p in result.plan.tenants if p.name == t.name)
        if plan.max_starts is not None:
            limit, peak = f"starts<={plan.max_starts}/{plan.window:g}s", f"{t.peak_starts} starts"
        elif plan.max_running is not None:
            limit, peak = f"running<={plan.max_running}", f"{t.peak_running} running"
        else:
            limit, peak = "-", f"{t.peak_running} running"
        table.add_row(t.name, limit, str(t.jobs), f"{t.backlog_share:.0%}",
                      str(t.starts_while_contended), f"{t.contended_share:.0%}", peak)
    console.print(table)
    for check in result.checks:
        mark = "[green]PASS[/green]" if check.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {check.name}: {check.detail}", soft_wrap=True)
    verdict = "all checks passed" if result.ok else "some checks FAILED"
    console.print(f"{verdict} ({result.elapsed:.1f}s)")


@click.command("demo")
@click.option("--seconds", type=click.FloatRange(demo_plan.MIN_SECONDS, demo_plan.MAX_SECONDS),
              default=None,
              help="Time budget; the workload is sized to finish in about half of it "
              f"(default: {demo_plan.DEFAULT_SECONDS:g}, or for a small --jobs "
              f"{demo_plan.JOBS_PER_SECOND} jobs a second, at least "
              f"{demo_plan.MIN_SECONDS:g}).")
@click.option("--jobs", type=click.IntRange(100, demo_plan.MAX_JOBS), default=None,
              help=f"Backlog size (default: {demo_plan.JOBS_PER_SECOND} per second of "
              "--seconds).")
@click.option("--slots", type=click.IntRange(min=4, max=64), default=demo_plan.SLOTS,
              show_default=True, help="Worker slots.")
@click.option("--plain", is_flag=True,
              help="Print progress lines instead of a live table (automatic when stdout "
              "is not a terminal).")
@click.option("--keep", is_flag=True,
              help="Keep the run's jobs for inspection (akadze jobs list -q QUEUE) instead "
              "of removing them at the end.")
@click.option("--clean", is_flag=True,
              help="Remove what earlier runs kept (their jobs, limits and start marks), "
              "then exit.")
@database_url_option
def command(
    seconds: float | None, jobs: int | None, slots: int, plain: bool, keep: bool,
    clean: bool, database_url: str | None,
) -> None:
    """Run a multi-tenant workload on a fair worker and check the outcome.

    Tenants of very different sizes share one queue; one tenant has a
    concurrency limit, one a start-rate limit; some jobs fail and retry; urgent
    jobs arrive mid-run. At the end the demo checks, from the database, that the
    tenants got fair shares, that no limit was exceeded and that the retries
    resolved. Exit 0 when every check passes, 1 otherwise. Without a URL it runs
    on the embedded server. A run removes its jobs and limits when it ends, also
    when interrupted (--keep keeps the jobs; --clean removes what runs kept).
    """
    url = resolve(database_url)
    if clean:
        runs, removed = asyncio.run(demo.clean(url))
        click.echo(f"removed {removed} jobs of {runs} earlier demo run{'s' * (runs != 1)}"
                   if runs else "nothing to clean: no earlier demo run left anything")
        return
    budget = seconds if seconds is not None else demo_plan.default_seconds(jobs)
    try:
        plan = demo_plan.make_plan(jobs or int(demo_plan.JOBS_PER_SECOND * budget), budget,
                                   slots)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    plain = plain or not sys.stdout.isatty()
    console = Console(highlight=False, width=140 if plain else None)
    console.print(
        f"akadze demo on {describe(url)}: {plan.total} jobs, {len(plan.tenants)} tenants, "
        f"jobs of ~{plan.duration * 1000:.0f} ms, budget {budget:g}s",
        soft_wrap=True,
        markup=False,
    )
    # The failing jobs fail on purpose: the worker's retry warnings would only
    # interleave with the progress display, which counts the retries itself.
    logger = logging.getLogger("akadze")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with _Progress(plan, console, plain) as progress:
            result = asyncio.run(demo.run(url, plan, on_snapshot=progress, keep=keep))
    except KeyboardInterrupt:
        kept = "its limits were removed; its jobs were kept" if keep else (
            "its jobs and limits were removed")
        click.echo(f"akadze: demo interrupted; {kept}", err=True)
        raise click.exceptions.Exit(130) from None
    finally:
        logger.setLevel(level)
    _summary(result, console)
    if keep:
        console.print(f"its jobs were kept: akadze jobs list -q {plan.queue} "
                      "(akadze demo --clean removes them)", markup=False)
    if not result.ok:
        raise click.exceptions.Exit(1)
