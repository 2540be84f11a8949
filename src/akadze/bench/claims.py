"""``akadze bench claims`` (not built yet)."""

from __future__ import annotations

import click


@click.command("claims")
def command() -> None:
    """(not built yet)"""
