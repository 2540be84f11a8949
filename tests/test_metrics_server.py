"""``akadze metrics --serve`` under load and failure (issue 21, finding 9): idle and
half-sent connections hold no threads and cannot keep a scrape out, every connection
times out, scrapes share one cached read over one database connection, and a failure
is a fixed 503 line with the reason in the log only."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from akadze import Akadze
from akadze.cli.metrics import UNAVAILABLE, MetricsServer
from akadze.clock import ManualClock
from akadze.control import pause_queue_sync

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n"  # the blank line never comes


@contextmanager
def serving(server: MetricsServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert not thread.is_alive()


def scrape(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def until(condition: Callable[[], bool], what: str, deadline: float = 15.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        time.sleep(0.01)  # polling observable state, with a deadline


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed (or reset) this client socket; never blocks."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_300_half_sent_requests_hold_no_thread_and_a_scrape_still_answers(
        database_url: str) -> None:
    server = MetricsServer(database_url, "127.0.0.1", 0, header_timeout=3.0)
    with serving(server) as url:
        assert scrape(url)[0] == 200  # the database connection is open now
        threads = threading.active_count()
        idle = []
        try:
            for _ in range(300):
                sock = socket.create_connection(server.server_address, timeout=10)
                sock.sendall(HALF_SENT)
                idle.append(sock)
            # The server took them all: beyond its 64 slots, the oldest were closed.
            until(lambda: sum(closed_by_server(s) for s in idle) >= 300 - 64,
                  "connections over the limit closed")
            assert server.open_connections <= 64
            assert threading.active_count() == threads  # not one thread more
            started = time.monotonic()
            status, body = scrape(url, timeout=5)
            assert status == 200 and "akadze_jobs" in body
            assert time.monotonic() - started < 3.0  # not behind the idle ones' timeouts
            # After the header timeout, the server closes every one of them.
            until(lambda: all(closed_by_server(s) for s in idle), "idle connections closed")
            until(lambda: server.open_connections == 0, "no connection left open")
            assert threading.active_count() == threads
        finally:
            for sock in idle:
                sock.close()


def test_a_request_head_too_long_is_closed_without_an_answer(database_url: str) -> None:
    server = MetricsServer(database_url, "127.0.0.1", 0)
    with serving(server) as url:
        with socket.create_connection(server.server_address, timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"x" * 10_000)
            until(lambda: closed_by_server(sock), "the long head closed")
        for path, status in (("/other", 404), ("/", 200), ("/metrics?x=1", 200)):
            assert scrape(url.replace("/metrics", path))[0] == status
        with socket.create_connection(server.server_address, timeout=10) as sock:
            sock.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 405")


def test_scrapes_share_one_read_per_second_over_one_connection(
        app: Akadze, database_url: str, conn: psycopg.Connection[Any]) -> None:
    clock = ManualClock()
    server = MetricsServer(database_url, "127.0.0.1", 0, clock=clock)

    def backends() -> set[int]:
        """The other client backends of the database. A connection closed a moment ago
        (pause_queue_sync's) keeps its backend listed until that process has exited,
        which a busy machine makes take a while: hence the waits below."""
        return {int(row[0]) for row in conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'").fetchall()}

    with serving(server) as url:
        with ThreadPoolExecutor(20) as pool:  # at once: one read, the others wait for it
            answers = list(pool.map(lambda _: scrape(url), range(20)))
        assert {status for status, _ in answers} == {200} and server.exposition.reads == 1
        until(lambda: len(backends()) == 1, "one backend: the server's connection")
        first = backends()
        pause_queue_sync(app, "mail")
        assert 'akadze_queue_paused{queue="mail"}' not in scrape(url)[1]  # the cached text
        clock.advance(1.0)
        assert 'akadze_queue_paused{queue="mail"} 1' in scrape(url)[1]
        assert server.exposition.reads == 2
        # the one connection of the server, kept open: the same backend read again
        until(lambda: len(backends()) == 1, "pause_queue_sync's backend gone")
        assert backends() == first


def test_a_failure_is_a_fixed_503_and_the_reason_goes_to_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    server = MetricsServer("postgresql://u:topsecret@127.0.0.1:1/d", "127.0.0.1", 0, clock=clock)
    caplog.set_level(logging.ERROR, logger="akadze.metrics")
    with serving(server) as url:
        for _ in range(3):
            assert scrape(url) == (503, UNAVAILABLE)
        assert server.exposition.reads == 1  # a database that is down is tried once a second
        clock.advance(1.0)
        assert scrape(url) == (503, UNAVAILABLE)
        assert server.exposition.reads == 2
    assert "Connection refused" not in UNAVAILABLE
    logged = [r.getMessage() for r in caplog.records if r.name == "akadze.metrics"]
    assert len(logged) == 2 and all(m.startswith("metrics scrape failed: cannot connect to "
                                       "postgresql://u:***@127.0.0.1:1/d") for m in logged)
    assert "topsecret" not in caplog.text
