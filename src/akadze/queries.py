"""Named SQL queries, loaded from the ``.sql`` files in ``akadze/sql/queries``.

A file holds one or more queries, each introduced by a line ``-- name: some_name``,
and fragments (``-- fragment: some_name``) that queries splice in with a line
``-- include: some_name``.
Runtime code refers to queries by name (``queries.get("claim_window")``) and never
builds SQL from user strings; identifiers, where needed, go through psycopg.sql.

The loader is a :class:`Queries` over one folder of a package; this module's
functions are those of the runtime's. The harness (``akadze.bench``) has a
loader of its own over its own folder, which may include the runtime's
fragments (the job row) but whose queries the runtime never sees.
"""

from __future__ import annotations

import re
from functools import cached_property
from importlib import resources

from psycopg import sql

_HEAD = re.compile(r"^--\s*(name|fragment):\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^--\s*include:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
#: How deep fragments may include fragments.
_INCLUDE_DEPTH = 4


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


def _parse(text: str, source: str) -> tuple[dict[str, str], dict[str, str]]:
    """The queries and the fragments of one file, as written."""
    found: tuple[dict[str, str], dict[str, str]] = ({}, {})
    parts = _HEAD.split(text)
    # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        into = found[0] if kind == "name" else found[1]
        if name in into:
            raise RuntimeError(f"{kind} {name!r} defined twice ({source})")
        into[name] = body
    return found


class Queries:
    """The named queries of the ``.sql`` files in one folder of a package.

    ``base``: another loader whose fragments these queries may include too (a
    name defined in both is refused)."""

    def __init__(self, package: str, *folder: str, base: Queries | None = None) -> None:
        self._package = package
        self._folder = folder
        self._base = base
        self._sql: dict[str, sql.SQL] = {}

    def _read(self) -> tuple[dict[str, str], dict[str, str]]:
        """The folder's queries and fragments, as written."""
        queries: dict[str, str] = {}
        fragments: dict[str, str] = {}
        folder = resources.files(self._package).joinpath(*self._folder)
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".sql"):
                continue
            named, shared = _parse(entry.read_text(encoding="utf-8"), entry.name)
            for into, found in ((queries, named), (fragments, shared)):
                for name, body in found.items():
                    if name in into:
                        raise RuntimeError(f"{name!r} defined twice ({entry.name})")
                    into[name] = body
        return queries, fragments

    @cached_property
    def _fragments(self) -> dict[str, str]:
        """Every fragment these queries may include: the folder's and the base's."""
        own = self._read()[1]
        inherited = self._base._fragments if self._base is not None else {}
        for name in own.keys() & inherited.keys():
            raise RuntimeError(f"fragment {name!r} defined twice ({'/'.join(self._folder)})")
        return {**inherited, **own}

    @cached_property
    def _all(self) -> dict[str, str]:
        """Every query, with its ``-- include: fragment`` lines replaced by the named
        fragment (``-- fragment: name``, in any file: a shared part of several
        queries, not a query by itself), then compacted."""
        fragments = self._fragments

        def fragment(match: re.Match[str]) -> str:
            try:
                return fragments[match.group(1)]
            except KeyError:
                raise RuntimeError(f"no SQL fragment named {match.group(1)!r}") from None

        def spliced(name: str, body: str) -> str:
            # A fragment may include fragments too, up to a few levels (a cycle of
            # includes would never end).
            for _ in range(_INCLUDE_DEPTH):
                if not _INCLUDE.search(body):
                    return body
                body = _INCLUDE.sub(fragment, body)
            raise RuntimeError(f"query {name!r}: fragments included more than "
                               f"{_INCLUDE_DEPTH} levels deep (a cycle?)")

        return {name: _compact(spliced(name, body)).rstrip(";").strip()
                for name, body in self._read()[0].items()}

    def text(self, name: str) -> str:
        """The SQL text of the named query."""
        try:
            return self._all[name]
        except KeyError:
            raise KeyError(f"no SQL query named {name!r}") from None

    def get(self, name: str) -> sql.SQL:
        """The named query as a psycopg ``sql.SQL`` object, ready to execute: the same
        object at every call (so psycopg's caches keyed on it hit)."""
        found = self._sql.get(name)
        if found is None:
            found = self._sql.setdefault(name, sql.SQL(self.text(name)))
        return found

    def names(self) -> list[str]:
        return sorted(self._all)


runtime = Queries("akadze", "sql", "queries")


def text(name: str) -> str:
    """The SQL text of the named runtime query."""
    return runtime.text(name)


def get(name: str) -> sql.SQL:
    """The named runtime query as a psycopg ``sql.SQL`` object, ready to execute."""
    return runtime.get(name)


def names() -> list[str]:
    return runtime.names()
