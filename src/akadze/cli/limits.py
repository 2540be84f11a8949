"""``akadze limits list|set|clear``: the cluster-wide limits of limit keys."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import click

from ..database import connect
from ..limits import KEEP, LimitSummary, clear_limit_sync, list_limits_sync, set_limit_sync
from ._render import echo
from .options import database_url_option, json_option, print_json, print_table, resolve

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_NONE = ("none", "null", "off")
_UNSET = "__unset__"  # an option not given: the stored value is kept


def parse_duration(text: str) -> timedelta:
    """``10s``, ``5m``, ``1h``, ``2d``, ``250ms`` or a plain number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (use 10s, 5m, 1h, 2d, 250ms or seconds)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{text!r} is too long a duration") from None


def format_duration(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _count_or_none(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    """An option's whole number, ``None`` for 'none', or _UNSET when not given."""
    if value == _UNSET:
        return value
    if value.strip().lower() in _NONE:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a whole number (or 'none' to clear it)", ctx, param
        ) from None


def _duration_or_none(ctx: click.Context, param: click.Parameter, value: str) -> Any:
    if value == _UNSET:
        return value
    if value.strip().lower() in _NONE:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _row(summary: LimitSummary) -> dict[str, Any]:
    return {
        "key": summary.key,
        "max_running": summary.max_running,
        "max_starts": summary.max_starts,
        "window_seconds": summary.window.total_seconds() if summary.window else None,
        "running": summary.running,
        "starts_in_window": summary.starts_in_window,
    }


@click.group("limits")
def command() -> None:
    """List, set and clear the cluster-wide limits of limit keys."""


@command.command("list")
@json_option
@database_url_option
def list_command(as_json: bool, database_url: str | None) -> None:
    """Every limit with its running jobs and starts in the current window."""
    summaries = list_limits_sync(resolve(database_url))
    if as_json:
        print_json([_row(s) for s in summaries])
        return
    if not summaries:
        click.echo("no limits")
        return
    print_table(
        None,
        ["key", "max running", "running", "max starts", "window", "starts in window"],
        [
            (
                s.key,
                "-" if s.max_running is None else s.max_running,
                s.running,
                "-" if s.max_starts is None else s.max_starts,
                format_duration(s.window),
                s.starts_in_window if s.window is not None else "-",
            )
            for s in summaries
        ],
    )


@command.command("set")
@click.argument("key")
@click.option(
    "--max-running", metavar="N|none", default=_UNSET, callback=_count_or_none,
    help="At most N jobs of the key run at once, cluster-wide ('none' clears it).",
)
@click.option(
    "--max-starts", metavar="N|none", default=_UNSET, callback=_count_or_none,
    help="At most N starts per window ('none' clears it, with --window none).",
)
@click.option(
    "--window", metavar="DURATION|none", default=_UNSET, callback=_duration_or_none,
    help="The sliding window of --max-starts: 10s, 5m, 1h, 2d or seconds.",
)
@json_option
@database_url_option
def set_command(
    key: str,
    max_running: Any,
    max_starts: Any,
    window: Any,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Create or change the limit of KEY; options not given keep their values."""
    if _UNSET == max_running == max_starts == window:
        raise click.UsageError("give at least one of --max-running, --max-starts, --window")
    # The URL, not a connection: the values are checked before anything connects.
    summary = set_limit_sync(
        resolve(database_url),
        key,
        max_running=KEEP if max_running == _UNSET else max_running,
        max_starts=KEEP if max_starts == _UNSET else max_starts,
        window=KEEP if window == _UNSET else window,
    )
    if as_json:
        print_json(_row(summary))
        return
    echo(
        f"limit {summary.key}: max running {_shown(summary.max_running)}, "
        f"max starts {_shown(summary.max_starts)} per {format_duration(summary.window)}"
    )


@command.command("clear")
@click.argument("key")
@database_url_option
def clear_command(key: str, database_url: str | None) -> None:
    """Remove the limit of KEY (and its recorded starts)."""
    with connect(resolve(database_url)) as conn:
        existed = clear_limit_sync(conn, key)
    echo(f"limit {key} cleared" if existed else f"no limit on {key}; nothing to clear")


def _shown(value: int | None) -> str:
    return "-" if value is None else str(value)
