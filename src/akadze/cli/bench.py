"""``akadze bench``: reproducible speed measurements with Markdown reports."""

from __future__ import annotations

import click

from ..bench import claims, cluster, enqueue, faults, idle, limits_busy, soak, throughput
from ..bench.dashboard import command as dashboard_command


@click.group("bench")
def command() -> None:
    """Measure enqueue, claim and worker speed on this machine."""


command.add_command(enqueue.command)
command.add_command(claims.command)
command.add_command(cluster.command)
command.add_command(throughput.command)
command.add_command(faults.command)
command.add_command(soak.command)
command.add_command(limits_busy.command)
command.add_command(idle.command)
command.add_command(dashboard_command)
