"""``akadze db``: not built yet."""

from __future__ import annotations

import click


@click.group("db")
def command() -> None:
    """(not built yet)"""
