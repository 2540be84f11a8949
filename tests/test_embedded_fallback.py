"""The test suite needs no server: without AKADZE_TEST_DATABASE_URL and with nothing on
the default port, the ``server_url`` fixture falls back to the embedded server."""

from __future__ import annotations

import psycopg
from conftest import fallback_server_url
from embedded_support import temporary_home

from akadze import embedded


def test_a_closed_default_port_falls_back_to_the_embedded_server() -> None:
    closed = f"postgresql://postgres@127.0.0.1:{embedded.free_port()}/postgres"
    assert not embedded.answers(closed)
    with temporary_home("akadze-fallback-") as home:
        url = fallback_server_url(closed, home=str(home))
        assert url != closed and f"host={home}/data" in url
        with psycopg.connect(url, autocommit=True) as admin:  # an admin URL: can create
            assert admin.execute("SELECT current_database()").fetchone() == ("postgres",)
            assert admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                                 ).fetchone() == (True,)


def test_an_answering_default_is_kept(server_url: str) -> None:
    assert fallback_server_url(server_url, home="/nonexistent/never-used") == server_url
