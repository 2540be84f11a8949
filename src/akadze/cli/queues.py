"""``akadze queues``: not built yet."""

from __future__ import annotations

import click


@click.group("queues")
def command() -> None:
    """(not built yet)"""
