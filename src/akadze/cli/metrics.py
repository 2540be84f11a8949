"""``akadze metrics``: not built yet."""

from __future__ import annotations

import click


@click.command("metrics")
def command() -> None:
    """(not built yet)"""
