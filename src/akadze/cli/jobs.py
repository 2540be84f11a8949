"""``akadze jobs list|show|cancel|requeue|retry``: find jobs and act on one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from ..cancellation import request_cancel_sync
from ..control import requeue_sync, retry_now_sync
from ..errors import InvalidJobState
from ..jobs import JobState
from ..overview import MAX_LIMIT, JobSummary, get_job_sync, list_jobs_sync
from ._render import echo
from .options import database_url_option, json_option, print_json, print_table, resolve

STATES = [s.value for s in JobState]


def _job_id(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A job id: a whole number from 1 (``jobs show abc`` says so, in those words)."""
    text = value.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) < 2**63:  # a bigint
        return int(text)
    raise click.BadParameter(
        f"{value!r} is not a job id (job ids are whole numbers from 1)", ctx, param
    )
# "-1" is an argument (a bad job id), not an unknown option.
ID_ARGUMENTS = {"ignore_unknown_options": True}


def when(value: datetime | None) -> str:
    """A UTC timestamp to the second, for tables."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def took(seconds: float) -> str:
    """A duration in one style at every size: 350ms, 6.8s, 5m03s, 2h05m, 3d04h."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    for unit, size, rest_unit, rest_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                             ("m", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size}{unit}{whole % size // rest_size:02d}{rest_unit}"
    return f"{whole}s"  # pragma: no cover - seconds >= 60 has a unit above


def parse_meta(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    """``key=value`` (a string) or ``key:=json`` (a number, true, null, ...)."""
    meta: dict[str, Any] = {}
    for item in values:
        equals = item.find("=")
        if equals > 0 and item[equals - 1] == ":":
            key, raw = item[: equals - 1], item[equals + 1 :]
            try:
                value: Any = json.loads(raw)
            except ValueError:
                raise click.BadParameter(f"{item!r}: {raw!r} is not JSON", ctx, param) from None
            except RecursionError:  # json.loads recurses once per level
                raise click.BadParameter(
                    f"the value of {key!r} is nested too deeply to be JSON meta", ctx, param
                ) from None
        elif "=" in item:
            key, _, value = item.partition("=")
        else:
            raise click.BadParameter(
                f"{item!r} is not key=value (or key:=json for numbers, booleans)", ctx, param
            )
        if not key:
            raise click.BadParameter(f"{item!r} has an empty key", ctx, param)
        meta[key] = value
    return meta or None


def _error_line(job: JobSummary) -> str:
    last = job.last_error
    if not last:
        return ""
    text = f"{last.get('error', '')}: {last.get('message', '')}".strip(": ")
    return text if len(text) <= 60 else text[:57] + "..."


@click.group("jobs")
def command() -> None:
    """Find jobs, show one, cancel, requeue or retry it."""


@command.command("list")
@click.option("--queue", "-q", default=None, help="Only jobs of this queue.")
@click.option("--state", "-s", "states", multiple=True, type=click.Choice(STATES),
              help="Only jobs in this state (repeatable).")
@click.option("--task", "-t", default=None, help="Only jobs of this task.")
@click.option("--meta", "-m", multiple=True, callback=parse_meta, metavar="KEY=VALUE",
              help="Only jobs whose meta has KEY=VALUE (a string; KEY:=JSON for other "
                   "types). Repeatable: all must match.")
@click.option("--limit", "-n", type=click.IntRange(1, MAX_LIMIT), default=50,
              show_default=True, help="At most this many jobs, newest first.")
@json_option
@database_url_option
def list_command(queue: str | None, states: tuple[str, ...], task: str | None,
                 meta: dict[str, Any] | None, limit: int, as_json: bool,
                 database_url: str | None) -> None:
    """Jobs matching the filters, newest first."""
    jobs = list_jobs_sync(resolve(database_url), queue=queue, state=list(states) or None,
                          task=task, meta=meta, limit=limit)
    if as_json:
        print_json([job.to_dict() for job in jobs])
        return
    if not jobs:
        click.echo("no jobs match")
        return
    print_table(
        None,
        ["id", "queue", "task", "state", "attempt", "run at", "finished", "last error"],
        [
            (job.id, job.queue, job.task, job.state.value,
             f"{job.attempt}/{job.max_attempts}", when(job.run_at), when(job.finished_at),
             _error_line(job))
            for job in jobs
        ],
        flexible=("last error",),
    )


def _ids(ids: tuple[int, ...], count: int) -> str:
    shown = ", ".join(str(i) for i in ids[:20])
    return shown + (f" and {count - min(len(ids), 20)} more" if count > min(len(ids), 20)
                    else "")


def _show(job: JobSummary) -> None:
    def line(label: str, value: Any) -> None:
        echo(f"  {label:<12}{value}")  # every line through echo: stored text made safe

    echo(f"job {job.id}: {job.task} on queue {job.queue}")
    line("state", f"{job.state.value}" + (" (cancel requested)" if job.cancel_requested
                                           and job.state == JobState.RUNNING else ""))
    line("attempt", f"{job.attempt} of {job.max_attempts} (runs so far: {job.run_count})")
    line("priority", job.priority)
    if job.limit_key:
        line("limit key", job.limit_key)
    if job.unique_key:
        line("unique key", job.unique_key)
    if job.unreadable:
        line("unreadable", job.unreadable)
    if job.meta:
        line("meta", json.dumps(job.meta, sort_keys=True))
    if job.worker_id:
        line("worker", job.worker_id)
    if job.expires_at:
        line("expires", when(job.expires_at))
    if job.progress is not None:
        shown = f"{job.progress:.0%}" + (f" {job.progress_message}" if job.progress_message
                                         else "")
        line("progress", shown + f" (at {when(job.progress_at)})")
    if job.parent_count or job.child_count:
        echo("workflow")
    if job.parent_count:
        line("parents", _ids(job.parents, job.parent_count)
             + (f" (waiting for {job.waiting_for})" if job.state == JobState.WAITING else ""))
    if job.child_count:
        line("children", _ids(job.children, job.child_count))
    echo("timings")
    line("created", when(job.created_at))
    line("run at", when(job.run_at))
    line("started", when(job.started_at))
    line("finished", when(job.finished_at))
    if job.started_at and job.finished_at and job.finished_at >= job.started_at:
        line("ran for", took((job.finished_at - job.started_at).total_seconds()))
    if job.started_at and job.started_at >= job.run_at:
        line("waited", took((job.started_at - job.run_at).total_seconds()))
    echo("arguments")
    if not job.args:
        echo("  (none)")
    for name, value in job.args.items():
        line(name, json.dumps(value))
    if job.result is not None:
        echo("result")
        echo("  " + json.dumps(job.result))
    # errors holds the run's history: errors, rescues and give-backs (not all errors)
    echo(f"history ({len(job.errors)} event{'s' if len(job.errors) != 1 else ''} "
               "recorded)")
    events: list[tuple[str, str]] = [(when(job.created_at), "enqueued")]
    for entry in job.errors:
        at = entry.get("at")
        stamp = when(datetime.fromisoformat(at)) if isinstance(at, str) else "-"
        events.append((stamp, f"attempt {entry.get('attempt', '?')}: "
                              f"{entry.get('error', 'error')}: {entry.get('message', '')}"))
        traceback = entry.get("traceback")
        if traceback:
            for tb_line in str(traceback).rstrip().splitlines()[-6:]:
                events.append(("", "    " + tb_line))
    if job.started_at and job.state == JobState.RUNNING:
        events.append((when(job.started_at), f"running on {job.worker_id or '?'}"))
    if job.finished_at:
        events.append((when(job.finished_at), job.state.value))
    for stamp, text in events:
        echo(f"  {stamp:<25}{text}")


@command.command("show", context_settings=ID_ARGUMENTS)
@click.argument("job_id", metavar="ID", callback=_job_id)
@json_option
@database_url_option
def show_command(job_id: int, as_json: bool, database_url: str | None) -> None:
    """One job: arguments, errors, timings and history."""
    job = get_job_sync(resolve(database_url), job_id)
    if as_json:
        print_json(job.to_dict())
        return
    _show(job)


@command.command("cancel", context_settings=ID_ARGUMENTS)
@click.argument("job_id", metavar="ID", callback=_job_id)
@database_url_option
def cancel_command(job_id: int, database_url: str | None) -> None:
    """Cancel a queued job (it never runs) or tell a running job to stop."""
    url = resolve(database_url)
    if not request_cancel_sync(url, job_id):
        state = get_job_sync(url, job_id).state.value
        raise InvalidJobState(f"job {job_id} has finished already ({state}); nothing to cancel")
    click.echo(f"job {job_id}: cancel requested")


@command.command("requeue", context_settings=ID_ARGUMENTS)
@click.argument("job_id", metavar="ID", callback=_job_id)
@database_url_option
def requeue_command(job_id: int, database_url: str | None) -> None:
    """Queue a failed or cancelled job again, with a fresh set of attempts."""
    requeue_sync(resolve(database_url), job_id)
    click.echo(f"job {job_id} requeued")


@command.command("retry", context_settings=ID_ARGUMENTS)
@click.argument("job_id", metavar="ID", callback=_job_id)
@database_url_option
def retry_command(job_id: int, database_url: str | None) -> None:
    """Run a queued job now instead of waiting for its backoff or delay."""
    moved = retry_now_sync(resolve(database_url), job_id)
    click.echo(f"job {job_id} is ready now" if moved else f"job {job_id} was ready already")
