"""``akadze demo``: not built yet."""

from __future__ import annotations

import click


@click.command("demo")
def command() -> None:
    """(not built yet)"""
