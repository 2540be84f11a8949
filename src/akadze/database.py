"""Database URLs and connections: which server, how to reach it, never leaking a password."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from .errors import ConfigurationError, DatabaseUnavailable

ENV_URL = "AKADZE_DATABASE_URL"

logger = logging.getLogger("akadze.database")

# SQLAlchemy-style driver suffixes that akadze 0.5 users may have in their URLs.
_SCHEMES = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "postgresql+psycopg": "postgresql",
    "postgresql+psycopg2": "postgresql",
    "postgresql+asyncpg": "postgresql",
    "postgresql+psycopg_async": "postgresql",
}

# -- masking --------------------------------------------------------------------------
#
# The forms a password takes in text (errors, logs, output), each masked as "***"
# with the text around it kept as it was (the separators too, so that masking twice
# changes nothing):
#
# * a URL's userinfo, scheme://user:PASSWORD@host. The password runs to the first "@"
#   that is followed by a host, a word with no other "@" in it: whatever it holds
#   before (a raw space, "/" or "@" too, which libpq refuses or reports back
#   verbatim) is masked. (A password in which an "@" starts a word followed by a
#   space cannot be told from the text after it; a URL without a password followed,
#   on the same line, by a word with an "@" loses a little more than its password.)
_PASSWORD_IN_URL = re.compile(
    r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/@:\s]*:)(?P<pw>[^\n]*?)(?P<tail>@)"
    r"(?=[^\s@]+(?:\s|$)|$)"
)
# * a dict or JSON key: 'password': '...', "password": "...", "db_password": 123, and
#   the same escaped inside a JSON string (\"password\": \"...\").
_QUOTED = r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\""
_PASSWORD_KEY = re.compile(
    r"(?P<head>(?P<q>['\"])\w*pass(?:word|wd)(?P=q)[ \t]*:[ \t]*)"
    rf"(?P<pw>{_QUOTED}|[^\s,;}}\]]+)",
    re.IGNORECASE,
)
# Inside the outer string, the inner one's escapes are escaped again: \\\\ is a
# backslash, \\\" a quote, \\n (or \u00e9 from the outer encoding) a character.
_ESCAPED_VALUE = r'\\"(?:\\\\\\\\|\\\\\\"|\\\\[^"\\]|\\[^"\\]|[^"\\\n])*\\"'
_PASSWORD_KEY_ESCAPED = re.compile(
    rf"(?P<head>\\\"\w*pass(?:word|wd)\\\"[ \t]*:[ \t]*)(?P<pw>{_ESCAPED_VALUE})",
    re.IGNORECASE,
)
# * key=value: libpq's password='...' or password=..., a URL's ?password=... (which
#   ends at "&" or "#"), PGPASSWORD=... and any *password= or *passwd=. Punctuation
#   that ends an unquoted value before a space or the end of the text (the ":" of
#   "password=x: connection failed") is taken as the text's own, not the password's.
_PASSWORD_KV = re.compile(
    r"(?P<head>(?P<sep>[?&])?\b\w*pass(?:word|wd)[ \t]*=[ \t]*)"
    rf"(?P<pw>{_QUOTED}|(?(sep)[^\s&#]+|\S+))",
    re.IGNORECASE,
)
_GIVEN_BACK = ".,;:)]}>'\""
# * the literal passwords of the URLs akadze was given (and $PGPASSWORD), wherever they
#   appear: in a task's exception, a driver's message. Only as a whole word (not inside
#   a longer run of letters and digits, so that "postgres" leaves "postgresql://"
#   alone), and only when it cannot be an ordinary word or number: from 8 characters,
#   or from 4 when it mixes letters with other characters ("s3 cret", which libpq
#   quotes back in its error about the space). The forms above mask the others.
_known_passwords: set[str] = set()
_literal_pattern: tuple[frozenset[str], re.Pattern[str] | None] = (frozenset(), None)


def _distinctive(password: str | None) -> bool:
    """Whether ``password`` may be masked wherever it appears, as a word."""
    if not password or "***" in password:
        return False
    if len(password) >= 8:
        return True
    letters = sum(ch.isalpha() for ch in password)
    return len(password) >= 4 and 0 < letters < len(password)


def remember_password(password: str | None) -> None:
    """Mask ``password`` wherever it appears in what :func:`mask_password` is given from
    now on (the URL functions here remember the password of every URL they see). A
    password that could be an ordinary word or number (shorter than 8 characters, and
    letters only or none) is masked in the forms of a password only."""
    if password is not None and _distinctive(password):
        _known_passwords.add(password)


def _remember_url(url: str) -> None:
    found: set[str] = set()
    with contextlib.suppress(ValueError):  # as given, and percent-decoded
        parts = urlsplit(url) if "://" in url else None
        if parts is not None and parts.password:
            found.update({parts.password, unquote(parts.password)})
    with contextlib.suppress(psycopg.Error, ValueError, TypeError):  # as libpq reads it
        found.add(str(conninfo_to_dict(url).get("password") or ""))
    for password in found:
        remember_password(password)


def _literals(extra: Iterable[str]) -> re.Pattern[str] | None:
    global _literal_pattern
    known = set(_known_passwords)
    for password in (os.environ.get("PGPASSWORD"), *extra):
        if password is not None and _distinctive(password):
            known.add(password)
    frozen = frozenset(known)
    if frozen != _literal_pattern[0]:
        alternatives = "|".join(re.escape(p) for p in sorted(frozen, key=len, reverse=True))
        pattern = (re.compile(rf"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])")
                   if frozen else None)
        _literal_pattern = (frozen, pattern)
    return _literal_pattern[1]


def _masked_value(value: str, rest_starts: str) -> str:
    """"***" in the quotes of ``value``, or for the unquoted value minus the punctuation
    that ends the text's own sentence (``rest_starts``: the character after it)."""
    if value[:1] in ("'", '"') and len(value) >= 2 and value[-1] == value[0]:
        return f"{value[0]}***{value[0]}"
    if rest_starts in ("", " ", "\t", "\n", "\r"):
        kept = value.rstrip(_GIVEN_BACK)
        if kept and kept != value:
            return "***" + value[len(kept):]
    return "***"


def _mask_pairs(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(
        lambda m: m.group("head") + _masked_value(m.group("pw"), text[m.end():m.end() + 1]),
        text,
    )


def _mask_escaped_pairs(text: str) -> str:
    return _PASSWORD_KEY_ESCAPED.sub(lambda m: m.group("head") + '\\"***\\"', text)


def mask_password(text: str, *, passwords: Iterable[str] = ()) -> str:
    """``text`` with every password in it replaced by ``***``: in URLs, ``password=``
    pairs (libpq, URL queries, ``PGPASSWORD=``), dict and JSON keys, and the literal
    passwords of the URLs akadze was given (:func:`remember_password`), of
    ``$PGPASSWORD`` and of ``passwords``. The text around each is kept as it was."""
    text = _PASSWORD_IN_URL.sub(lambda m: f"{m.group('head')}***{m.group('tail')}", text)
    text = _mask_escaped_pairs(text)
    text = _mask_pairs(_PASSWORD_KEY, text)
    text = _mask_pairs(_PASSWORD_KV, text)
    literals = _literals(passwords)
    return literals.sub("***", text) if literals is not None else text


class MaskingFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose lines are masked (:func:`mask_password`): message,
    arguments and traceback. The command line logs through it; give it to your own
    handlers to do the same::

        handler.setFormatter(MaskingFormatter("%(levelname)s %(name)s: %(message)s"))
    """

    def format(self, record: logging.LogRecord) -> str:
        return mask_password(super().format(record))


def normalize_url(url: str) -> str:
    """Check that ``url`` names a PostgreSQL server and return it in libpq form.

    Raises ConfigurationError (with the password masked) for anything else.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("database URL is empty")
    url = url.strip()
    _remember_url(url)  # its password is masked wherever it shows up from now on
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


def connect(url: str, *, autocommit: bool = True, application_name: str | None = None
            ) -> psycopg.Connection[tuple[object, ...]]:
    extra: dict[str, Any] = {} if application_name is None else {
        "application_name": application_name}
    try:
        return psycopg.connect(normalize_url(url), autocommit=autocommit, **extra)
    except (psycopg.OperationalError, psycopg.ProgrammingError, ValueError) as exc:
        raise _cannot_connect(url, exc) from None


async def connect_async(
    url: str, *, autocommit: bool = True, connect_timeout: int | None = None
) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """An async connection; ``connect_timeout`` (seconds) bounds the wait for the server
    (libpq's own default is to wait as long as the network does)."""
    extra: dict[str, Any] = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
    try:
        return await psycopg.AsyncConnection.connect(normalize_url(url), autocommit=autocommit,
                                                     **extra)
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


# -- ending a failed transaction ------------------------------------------------------
#
# A claim and an outcome write each send their statements as one pipeline inside an
# explicit transaction block. When the block fails (a statement's error, a
# cancellation or an error of ours between two statements), the block may be left
# open: these end it. If even the ROLLBACK fails, the connection is closed: a pooler
# that lost its server connection in the middle of a pipeline (PgBouncer's "server
# conn crashed?") leaves libpq waiting for replies that never come, and the
# connection would otherwise stay "in a transaction" for ever, refusing every later
# use. Closed, its pool replaces it, and its owner sees why in the error it raises
# anyway: neither function raises, so the failure's own error is the one seen.

# The statements that open and end such a block. READ COMMITTED whatever the
# server's or role's default_transaction_isolation: the limits protocol of a claim
# and of a hand-off locks a key's limits row, then counts the key's jobs in a new
# statement, and only READ COMMITTED gives that statement a snapshot that sees the
# commits of the transaction that held the row before (claim.sql, claim_counts;
# handoff.sql).
BEGIN_READ_COMMITTED = "BEGIN ISOLATION LEVEL READ COMMITTED"
COMMIT = "COMMIT"
_ROLLBACK = "ROLLBACK"


def _open(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE


def _closing(what: str, exc: Exception) -> None:
    logger.warning("rolling back a failed %s failed, closing its connection: %s",
                   what, mask_password(str(exc)))


def roll_back_failed(conn: psycopg.Connection[Any], what: str) -> None:
    """End the transaction a failed ``what`` (a claim, ...) left open, if any."""
    if not _open(conn):
        return
    try:
        conn.execute(_ROLLBACK, prepare=False)
    except Exception as exc:
        _closing(what, exc)
        conn.close()


async def roll_back_failed_async(conn: psycopg.AsyncConnection[Any], what: str) -> None:
    """As :func:`roll_back_failed`."""
    if not _open(conn):
        return
    try:
        await conn.execute(_ROLLBACK, prepare=False)
    except Exception as exc:
        _closing(what, exc)
        await conn.close()
