"""``akadze bench throughput`` (not built yet)."""

from __future__ import annotations

import click


@click.command("throughput")
def command() -> None:
    """(not built yet)"""
