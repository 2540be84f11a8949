"""``akadze jobs``: not built yet."""

from __future__ import annotations

import click


@click.group("jobs")
def command() -> None:
    """(not built yet)"""
