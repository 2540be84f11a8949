"""The bench's TCP proxy: latency, and a pause that holds everything without closing."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from akadze.bench.fault_outages import start_proxy
from akadze.bench.proxy import Proxy


def test_a_paused_proxy_holds_a_query_and_delivers_it_on_resume(database_url: str) -> None:
    proxy, url = start_proxy(database_url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            proxy.pause()
            answered = threading.Event()
            answers: list[object] = []

            def ask() -> None:
                answers.append(conn.execute("SELECT 2").fetchone())
                answered.set()

            asker = threading.Thread(target=ask, daemon=True)
            asker.start()
            # Nothing may come back while paused (a wait that could only fail early).
            assert not answered.wait(0.5) and proxy.paused
            assert not conn.closed
            proxy.resume()
            assert answered.wait(10)
            assert answers == [(2,)]
    finally:
        proxy.stop()


def test_the_delay_applies_to_each_way(database_url: str) -> None:
    proxy, url = start_proxy(database_url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            proxy.set_delay(0.2)
            began = time.monotonic()
            conn.execute("SELECT 1")
            assert time.monotonic() - began >= 0.4  # there and back
            with pytest.raises(ValueError, match="negative"):
                proxy.set_delay(-1)
    finally:
        proxy.stop()


def test_a_stopped_proxy_closes_its_connections(database_url: str) -> None:
    proxy, url = start_proxy(database_url)
    conn = psycopg.connect(url, autocommit=True)
    proxy.stop()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()


def test_a_unix_socket_url_is_refused() -> None:
    with pytest.raises(ValueError, match="TCP"):
        start_proxy(make_conninfo("", host="/tmp", dbname="x"))
    with pytest.raises(RuntimeError, match="not running"):
        Proxy("127.0.0.1", 1).pause()
