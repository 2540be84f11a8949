"""The latency-injecting proxy of the benchmarks and fault scenarios (akadze.bench.proxy)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from akadze.bench.cluster import round_trip_ms
from akadze.bench.proxy import Proxy, ProxyError, proxied_url


def _backend_pids(database_url: str) -> set[int]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()").fetchall()
    return {row[0] for row in rows}


def test_the_injected_round_trip_is_twice_the_delay(database_url: str) -> None:
    with Proxy.for_url(database_url) as proxy:
        url = proxy.url(database_url)
        plain = round_trip_ms(url, n=60) / 1000
        proxy.set_delay(0.002)
        delayed = round_trip_ms(url, n=30) / 1000
    # The fastest of each, and a lower bound only: a busy machine adds time, never
    # takes it away (4 ms injected; room for a plain round trip slowed throughout).
    assert delayed - plain >= 0.0035, (plain, delayed)


def test_pause_holds_traffic_and_keeps_the_connection(database_url: str) -> None:
    with Proxy.for_url(database_url) as proxy, \
            psycopg.connect(proxy.url(database_url), autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        proxy.pause()
        answered = threading.Event()
        result: list[object] = []

        def query() -> None:
            result.append(conn.execute("SELECT 41 + 1").fetchone())
            answered.set()

        thread = threading.Thread(target=query)
        thread.start()
        # Nothing crosses a paused proxy: no answer within a generous window...
        assert not answered.wait(0.5)
        # ... and the server still has the connection, not killed by the partition.
        assert pid in _backend_pids(database_url)
        # A connection made meanwhile is accepted and waits for the heal.
        late: list[int] = []
        opener = threading.Thread(target=lambda: late.append(_connect_pid(proxy.url(database_url))))
        opener.start()
        _wait_until(lambda: proxy.stats()[1] == 2)
        proxy.resume()
        assert answered.wait(10)
        thread.join(10)
        opener.join(10)
        assert result == [(42,)]
        assert conn.execute("SELECT pg_backend_pid()").fetchone() == (pid,)
        assert len(late) == 1 and late[0] != pid


def _wait_until(condition: Callable[[], bool], deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not met within the deadline")
        time.sleep(0.01)


def _connect_pid(url: str) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index, no-any-return]


def test_cut_closes_every_connection(database_url: str) -> None:
    with Proxy.for_url(database_url) as proxy, \
            psycopg.connect(proxy.url(database_url), autocommit=True) as conn:
        conn.execute("SELECT 1")
        assert proxy.cut() == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        accepted, open_now, forwarded = proxy.stats()
        assert (accepted, open_now) == (1, 0) and forwarded > 0
        assert proxy.cpu_seconds() > 0


def test_bad_delays_and_a_closed_proxy_are_refused() -> None:
    with pytest.raises(ValueError, match="delay must be 0 to 60 seconds"):
        Proxy(delay=-0.1)
    with Proxy() as proxy:
        with pytest.raises(ProxyError, match="delay must be 0 to 60 seconds"):
            proxy.set_delay(61)
        assert proxy.delay == 0.0
    with pytest.raises(ProxyError, match="not running"):
        proxy.pause()


def test_proxied_url_keeps_user_password_and_database() -> None:
    assert (proxied_url("postgresql://u:s3cret@db.example:6543/app?sslmode=disable", 7000)
            == "postgresql://u:s3cret@127.0.0.1:7000/app?sslmode=disable")
    assert proxied_url("postgresql://db/app", 7001) == "postgresql://127.0.0.1:7001/app"
    pointed = proxied_url("host=db hostaddr=10.0.0.1 port=5432 dbname=app user=u", 7002)
    assert conninfo_to_dict(pointed) == {"host": "127.0.0.1", "port": "7002", "dbname": "app",
                                         "user": "u"}
