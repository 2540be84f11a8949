"""``akadze bench``: not built yet."""

from __future__ import annotations

import click


@click.group("bench")
def command() -> None:
    """(not built yet)"""
