"""The embedded PostgreSQL server used when no database URL is given (not built yet)."""

from __future__ import annotations

from .errors import ConfigurationError


def default_url() -> str:
    raise ConfigurationError(
        "no database URL: pass --database-url or set AKADZE_DATABASE_URL"
    )
