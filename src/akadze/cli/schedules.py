"""``akadze schedules``: not built yet."""

from __future__ import annotations

import click


@click.group("schedules")
def command() -> None:
    """(not built yet)"""
