"""``akadze queues list|pause|resume``: queue counts, lag, and cluster-wide pauses."""

from __future__ import annotations

import click

from ..control import pause_queue_sync, resume_queue_sync
from ..jobs import JobState
from ..overview import QueueSnapshot, list_workers_sync, queue_snapshot_sync
from ._render import echo
from .jobs import took, when
from .options import database_url_option, json_option, print_json, print_table, resolve


@click.group("queues")
def command() -> None:
    """List queues with their counts and lag; pause or resume one cluster-wide."""


@command.command("list")
@json_option
@database_url_option
def list_command(as_json: bool, database_url: str | None) -> None:
    """Every queue (with jobs, or paused): jobs per state, oldest-ready lag, paused."""
    snapshots = queue_snapshot_sync(resolve(database_url))
    if as_json:
        print_json([s.to_dict() for s in snapshots])
        return
    if not snapshots:
        click.echo("no queues (no jobs, nothing paused)")
        return
    print_table(
        None,
        ["queue", "paused", "ready", "scheduled", "running", "succeeded", "failed",
         "cancelled", "oldest ready lag"],
        [
            (s.queue, f"yes (since {when(s.paused_at)})" if s.paused else "no", s.ready,
             s.scheduled, s.count(JobState.RUNNING), s.count(JobState.SUCCEEDED),
             s.count(JobState.FAILED), s.count(JobState.CANCELLED),
             took(s.lag.total_seconds()) if s.lag is not None else "-")
            for s in snapshots
        ],
    )
    _warn_waiting(snapshots, database_url)


@command.command("pause")
@click.argument("queue")
@click.option("--force", is_flag=True,
              help="Pause a queue that has no jobs and no worker yet (refused otherwise, "
              "as a probable typo).")
@database_url_option
def pause_command(queue: str, force: bool, database_url: str | None) -> None:
    """Stop every worker from claiming jobs of QUEUE (running jobs finish)."""
    url = resolve(database_url)
    if not force and not _known(url, queue):
        raise click.UsageError(
            f"queue {queue!r} has no jobs and no worker serves it (a typo?); "
            "pass --force to pause it anyway"
        )
    changed = pause_queue_sync(url, queue)
    echo(f"queue {queue} paused" if changed else f"queue {queue} was paused already")


@command.command("resume")
@click.argument("queue")
@database_url_option
def resume_command(queue: str, database_url: str | None) -> None:
    """Let workers claim jobs of QUEUE again."""
    changed = resume_queue_sync(resolve(database_url), queue)
    echo(f"queue {queue} resumed" if changed else f"queue {queue} was not paused")


def _known(url: str, queue: str) -> bool:
    """Whether ``queue`` has jobs, is paused, or is served by a registered worker."""
    snapshot = queue_snapshot_sync(url, queue)
    if snapshot.total or snapshot.paused:
        return True
    return any(queue in worker.queues for worker in list_workers_sync(url))


def _warn_waiting(snapshots: list[QueueSnapshot], database_url: str | None) -> None:
    """Lines under the table for ready jobs that nothing will run as things stand."""
    for s in snapshots:
        for task, count in s.unserved:
            echo(f"warning: queue {s.queue}: {count} ready job{'s' * (count != 1)} of "
                 f"task {task!r}, which no live worker of the queue runs")
    idle = [s for s in snapshots if s.ready and not s.paused and not s.unserved]
    if idle:
        served = {q for w in list_workers_sync(resolve(database_url)) if w.alive
                  for q in w.queues}
        for s in idle:
            if s.queue not in served:
                echo(f"note: queue {s.queue}: {s.ready} ready job{'s' * (s.ready != 1)} "
                     "and no live worker serves it")
