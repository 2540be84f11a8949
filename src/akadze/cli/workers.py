"""``akadze workers list``: the registered workers and what they run."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from ..overview import list_workers_sync
from .jobs import took, when
from .options import database_url_option, json_option, print_json, print_table, resolve


@click.group("workers")
def command() -> None:
    """List the workers of the cluster."""


@command.command("list")
@json_option
@database_url_option
def list_command(as_json: bool, database_url: str | None) -> None:
    """Host, pid, queues, start, last heartbeat and running jobs of every worker."""
    workers = list_workers_sync(resolve(database_url))
    if as_json:
        print_json([w.to_dict() for w in workers])
        return
    if not workers:
        click.echo("no workers registered")
        return
    now = datetime.now(UTC)
    print_table(
        None,
        ["id", "host", "pid", "queues", "started", "last heartbeat", "lease", "running"],
        [
            (w.id, w.host, w.pid, ", ".join(w.queues), when(w.started_at),
             f"{took(max(0.0, (now - w.heartbeat_at).total_seconds()))} ago"
             + ("" if w.alive else " (expired)"),
             took(w.lease.total_seconds()), w.running)
            for w in workers
        ],
        flexible=("queues",),
    )
