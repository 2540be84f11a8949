"""Stored strings on a terminal: how every CLI command prints what it read.

Queue names, limit keys, task names, meta, arguments, results and error texts come
from whoever could write to the schema, so nothing of them may act on the terminal
or on rich:

- every character that is not printable (ESC and the escape sequences it starts,
  OSC hyperlinks and window titles, BEL, backspace, carriage return and newline,
  the C1 controls, the bidirectional and zero-width format characters) is written as
  its Python escape (``\\x1b``, ``\\u202e``), so what is stored is what the operator
  reads, and the terminal interprets none of it;
- table cells are plain text laid out by :mod:`akadze.cli.tables`, never markup:
  ``[/bogus]`` or ``[link=https://evil.example]q1[/link]`` is shown as written (and
  cannot crash the table);
- passwords are masked (:func:`akadze.database.mask_password`), in JSON too.

:func:`print_table`, :func:`print_json` and :func:`echo` are the only ways commands
print what they read; :func:`shown` is the text they are built from. Log lines go
through :func:`log_to_stderr`'s masking formatter.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import click

from ..database import MaskingFormatter, mask_password
from . import tables


def shown(value: object) -> str:
    """``value`` as text safe for a terminal: masked, with every character that is not
    printable written as its escape (one line, whatever it holds)."""
    text = mask_password(value if isinstance(value, str) else str(value))
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _cell(value: object) -> object:
    """A cell as :mod:`akadze.cli.tables` lays it out: numbers as they are (aligned
    right), everything else as :func:`shown` text."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    return shown(value)


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
                flexible: Collection[str] = ()) -> None:
    """A table for people (:mod:`akadze.cli.tables`), every cell and the title literal
    text, never markup; on a terminal only the ``flexible`` columns may be shortened to
    fit, in a pipe nothing is."""
    terminal = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else None
    lines = tables.render(None if title is None else shown(title),
                          [shown(column) for column in columns],
                          ([_cell(cell) for cell in row] for row in rows),
                          width=width, flexible=flexible, bold=terminal)
    click.echo("\n".join(lines))


def print_json(data: Any) -> None:
    """JSON for scripts: ASCII-escaped (no control character is written raw), masked."""
    click.echo(mask_password(json.dumps(data, indent=2, default=str, sort_keys=False)))


def echo(line: str) -> None:
    """One line of a plain view, made safe by :func:`shown` (the command's own labels and
    layout hold nothing it changes)."""
    click.echo(shown(line))


def log_to_stderr(level: str | int, fmt: str) -> None:
    """Log lines of long-running commands (worker, dashboard, metrics) to stderr, masked
    (:class:`akadze.database.MaskingFormatter`): a task's exception or a driver's
    message logged with its traceback shows no password."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
