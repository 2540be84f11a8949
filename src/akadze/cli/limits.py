"""``akadze limits``: not built yet."""

from __future__ import annotations

import click


@click.group("limits")
def command() -> None:
    """(not built yet)"""
