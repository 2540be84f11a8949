"""``akadze worker``: not built yet."""

from __future__ import annotations

import click


@click.command("worker")
def command() -> None:
    """(not built yet)"""
