"""``akadze bench enqueue`` (not built yet)."""

from __future__ import annotations

import click


@click.command("enqueue")
def command() -> None:
    """(not built yet)"""
