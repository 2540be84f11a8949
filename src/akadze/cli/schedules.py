"""``akadze schedules list MODULE:APP``: the app's periodic schedules and their next fire."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import click

from ..schedules import Schedule
from .apps import load_app
from .jobs import when
from .options import json_option, print_json, print_table


@click.group("schedules")
def command() -> None:
    """Periodic schedules of an app."""


def _local(schedule: Schedule, fire: datetime | None) -> str:
    if fire is None or schedule.timezone in (None, "UTC"):
        return "-"
    return fire.astimezone(ZoneInfo(schedule.timezone or "UTC")).strftime("%Y-%m-%d %H:%M%z")


@command.command("list")
@click.argument("app_reference", metavar="MODULE:APP|PATH.py:APP")
@json_option
def list_command(app_reference: str, as_json: bool) -> None:
    """Every schedule of the app with its next fire (computed now, no database)."""
    app = load_app(app_reference)
    now = app.clock.now().astimezone(UTC)
    schedules = sorted(app.schedules.values(), key=lambda s: s.name)
    rows = [(s, s.next_fire(now)) for s in schedules]
    if as_json:
        print_json([
            {"name": s.name, "task": s.task, "cron": s.cron.text if s.cron else None,
             "every_seconds": s.every.total_seconds() if s.every else None,
             "timezone": s.timezone, "overlap": s.overlap,
             "grace_seconds": s.grace.total_seconds(),
             "next_fire": fire.isoformat() if fire else None}
            for s, fire in rows
        ])
        return
    if not rows:
        click.echo("no schedules")
        return
    print_table(
        None,
        ["name", "task", "when", "overlap", "next fire (UTC)", "next fire (local)"],
        [(s.name, s.task, s.when, "yes" if s.overlap else "no", when(fire), _local(s, fire))
         for s, fire in rows],
    )
