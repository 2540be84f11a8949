"""Named SQL queries, loaded from the ``.sql`` files in ``akadze/sql/queries``.

A file holds one or more queries, each introduced by a line ``-- name: some_name``.
Runtime code refers to queries by name (``queries.get("claim_window")``) and never
builds SQL from user strings; identifiers, where needed, go through psycopg.sql.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from psycopg import sql

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def _compact(body: str) -> str:
    """The query as sent: without its comment lines, blank lines and indentation.

    The comments stay in the ``.sql`` files, where they explain the query; the
    server does not need them, and psycopg caches its conversion of a query (the
    placeholders) only for texts up to 4 KiB: the claim's longest statements
    pass that with their comments, and were parsed again at every execution.
    Only whole comment lines go (no SQL string of ours spans lines or starts a
    line with ``--``)."""
    lines = (line.strip() for line in body.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def _parse(text: str, source: str) -> dict[str, str]:
    found: dict[str, str] = {}
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in found:
            raise RuntimeError(f"query {name!r} defined twice ({source})")
        found[name] = _compact(body).rstrip(";").strip()
    return found


@cache
def _all() -> dict[str, str]:
    found: dict[str, str] = {}
    folder = resources.files("akadze").joinpath("sql", "queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, body in _parse(entry.read_text(encoding="utf-8"), entry.name).items():
            if name in found:
                raise RuntimeError(f"query {name!r} defined twice ({entry.name})")
            found[name] = body
    return found


def text(name: str) -> str:
    """The SQL text of the named query."""
    try:
        return _all()[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r}") from None


@cache
def get(name: str) -> sql.SQL:
    """The named query as a psycopg ``sql.SQL`` object, ready to execute."""
    return sql.SQL(text(name))


def names() -> list[str]:
    return sorted(_all())
