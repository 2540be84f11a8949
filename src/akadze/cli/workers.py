"""``akadze workers``: not built yet."""

from __future__ import annotations

import click


@click.group("workers")
def command() -> None:
    """(not built yet)"""
