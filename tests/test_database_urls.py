from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akadze.database import mask_password, normalize_url, resolve_url, sqlalchemy_url
from akadze.errors import ConfigurationError


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgres://u:pw@h:5433/db", "postgresql://u:pw@h:5433/db"),
        ("postgresql+psycopg://u@h/db", "postgresql://u@h/db"),
        ("postgresql+asyncpg://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require"),
        ("host=localhost dbname=x", "host=localhost dbname=x"),
    ],
)
def test_postgres_urls_are_accepted(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


@pytest.mark.parametrize(
    "url",
    ["mysql://root:hunter2@db/app", "sqlite:///x.db", "redis://:hunter2@h", "http://u:hunter2@h/"],
)
def test_other_urls_are_refused_without_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        normalize_url(url)
    assert "hunter2" not in str(info.value)
    assert "not a PostgreSQL URL" in str(info.value)


def test_empty_url_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        normalize_url("  ")


def test_resolve_prefers_explicit_then_environment() -> None:
    env = {"AKADZE_DATABASE_URL": "postgresql://env@h/db"}
    assert resolve_url("postgresql://explicit@h/db", env) == "postgresql://explicit@h/db"
    assert resolve_url(None, env) == "postgresql://env@h/db"


def test_explicit_empty_url_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigurationError, match="empty"):
        resolve_url("", {"AKADZE_DATABASE_URL": "postgresql://env@h/db"})


def test_sqlalchemy_url_uses_psycopg_driver() -> None:
    assert sqlalchemy_url("postgres://u:p@h/db") == "postgresql+psycopg://u:p@h/db"


passwords = st.text(
    alphabet=st.characters(
        blacklist_characters="/", blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")
    ),
    min_size=4,
    max_size=30,
).filter(lambda p: p.strip() == p and "***" not in p)


@given(password=passwords, user=st.from_regex(r"[a-z]{1,8}", fullmatch=True))
def test_mask_password_hides_any_password(password: str, user: str) -> None:
    text = f"cannot connect to postgresql://{user}:{password}@db.example:5432/app now"
    masked = mask_password(text)
    # The whole text, exactly: "password not in masked" failed on passwords that
    # are also part of the rest of the text ("post", "5432"), masked or not.
    assert masked == f"cannot connect to postgresql://{user}:***@db.example:5432/app now"


def test_mask_password_in_keyword_form() -> None:
    assert "s3cret" not in mask_password("host=h password=s3cret dbname=x")
