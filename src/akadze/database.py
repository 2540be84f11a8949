"""Database URLs and connections: which server, how to reach it, never leaking a password."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

import psycopg

from .errors import ConfigurationError, DatabaseUnavailable

ENV_URL = "AKADZE_DATABASE_URL"

# SQLAlchemy-style driver suffixes that akadze 0.5 users may have in their URLs.
_SCHEMES = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "postgresql+psycopg": "postgresql",
    "postgresql+psycopg2": "postgresql",
    "postgresql+asyncpg": "postgresql",
    "postgresql+psycopg_async": "postgresql",
}

_PASSWORD_IN_URL = re.compile(
    r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/@:\s]*:)(?P<pw>[^/\s]*)(?P<tail>@)"
)
# A value masked already (``***``, maybe followed by the punctuation of the sentence
# around it) is left alone, so that masking twice changes nothing: ``\S+`` would
# swallow the ": " after "?password=***" in "cannot connect to URL: reason".
_PASSWORD_KV = re.compile(
    r"(?P<head>\bpassword\s*=\s*)"
    r"(?P<pw>\*\*\*(?=[:;,.)\]]*(?:\s|$))|'(?:[^'\\]|\\.)*'|\S+)",
    re.IGNORECASE,
)


def mask_password(text: str) -> str:
    """Replace every password in URLs or ``password=`` pairs within ``text`` by ``***``."""
    text = _PASSWORD_IN_URL.sub(lambda m: f"{m.group('head')}***{m.group('tail')}", text)
    return _PASSWORD_KV.sub(lambda m: f"{m.group('head')}***", text)


def normalize_url(url: str) -> str:
    """Check that ``url`` names a PostgreSQL server and return it in libpq form.

    Raises ConfigurationError (with the password masked) for anything else.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("database URL is empty")
    url = url.strip()
    if "://" not in url and "=" in url:
        return url  # a libpq key=value conninfo string: libpq checks it when connecting
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if any(not ch.isprintable() or ch.isspace() for ch in host):
            raise ValueError("the host name has a control or space character")
        host.encode("idna")  # what the resolver will need
    except (ValueError, UnicodeError) as exc:  # a bracket left open, a bad host...
        raise ConfigurationError(
            f"database URL {mask_password(url)!r} is malformed ({mask_password(str(exc))})"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        shown = mask_password(url)
        raise ConfigurationError(
            f"database URL {shown!r} is not a PostgreSQL URL "
            "(expected postgresql://user@host:port/dbname)"
        )
    # Only the scheme changes: urlunsplit would drop the "//" of an empty host
    # ("postgresql://" means every libpq default), turning the URL into nonsense.
    return "postgresql" + url[len(parts.scheme):]


def sqlalchemy_url(url: str) -> str:
    """The same server as a SQLAlchemy URL using the psycopg 3 driver."""
    normalized = normalize_url(url)
    if "://" not in normalized:  # key=value conninfo: SQLAlchemy passes it through as dsn
        return "postgresql+psycopg:///?" + urlencode({"dsn": normalized})
    return "postgresql+psycopg" + normalized[len("postgresql") :]


def resolve_url(url: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The database URL to use: the explicit one, else ``AKADZE_DATABASE_URL``, else the
    embedded server (when the ``embedded`` extra is installed)."""
    if url is not None:
        return normalize_url(url)  # an explicit empty URL is refused, not ignored
    environ = os.environ if env is None else env
    from_env = environ.get(ENV_URL)
    if from_env:
        return normalize_url(from_env)
    from . import embedded  # late import: the launcher is only needed without a URL

    return normalize_url(embedded.default_url())


def describe(url: str) -> str:
    """A form of the URL that is safe to log and print."""
    return mask_password(url)


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(normalize_url(url), autocommit=autocommit)
    except (psycopg.OperationalError, psycopg.ProgrammingError, ValueError) as exc:
        raise _cannot_connect(url, exc) from None


async def connect_async(
    url: str, *, autocommit: bool = True
) -> psycopg.AsyncConnection[tuple[object, ...]]:
    try:
        return await psycopg.AsyncConnection.connect(normalize_url(url), autocommit=autocommit)
    except (psycopg.OperationalError, psycopg.ProgrammingError, ValueError) as exc:
        raise _cannot_connect(url, exc) from None


# What libpq puts before its reason, which the URL in our line already says.
_LIBPQ_PREFIX = re.compile(
    r'^(?:connection (?:failed|is bad): )?'
    r'(?:connection to server (?:at "[^"]*"(?:, port \d+)?|on socket "[^"]*") failed: )?'
    r'(?:FATAL: +)?'
)


def _cannot_connect(url: str, exc: Exception) -> ConfigurationError:
    """One masked line for a failed connection: DatabaseUnavailable when the server could
    not be reached or refused the login (OperationalError), a plain ConfigurationError
    when libpq could not even use the URL (ProgrammingError: an unknown option;
    ValueError: a host name that cannot be encoded, a malformed conninfo string)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reason = _LIBPQ_PREFIX.sub("", reason) or reason
    if reason in ("Connection refused", "No such file or directory"):
        reason += " (is the server running?)"
    message = f"cannot connect to {describe(url)}: {mask_password(reason)}"
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(message)
    return ConfigurationError(message)
